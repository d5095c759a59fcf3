"""The steps of a rule release as plain functions (no Airflow needed to run or test them).

    detect_candidate -> validate_candidate -> prepare_history -> [backtests] ->
    build_release_report -> [approval] -> [publish] -> record_decision

The DAG (dags/rule_release.py) calls these from thin tasks; Airflow adds scheduling,
the Spark submission, the approval page and retries. Everything a step needs travels
in JSON-ready dicts, which is what XCom carries between tasks.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path

from spark_jobs.lifecycle import audit
from spark_jobs.lifecycle import git as g
from spark_jobs.lifecycle.history import compute_window, slice_inputs
from spark_jobs.lifecycle.settings import LifecycleSettings
from spark_jobs.report import RuleChange, build_report, load_backtest, write_report
from spark_jobs.rules.loader import RuleError
from spark_jobs.rules.model import AnyRule, base_id, parse_rule, rule_to_json_dict, shadow_id

log = logging.getLogger(__name__)

REPORT_URL_PREFIX = "/rule-reports"
REPORT_XCOM_KEY = "rule_report"


class ValidationFailed(RuntimeError):
    """The commit's rules are invalid; carries the errors (file, field, reason)."""

    def __init__(self, errors: list[dict]) -> None:
        self.errors = errors
        lines = [f"  {e['file']}: field '{e['field']}': {e['reason']}" for e in errors]
        super().__init__(f"{len(errors)} rule error(s):\n" + "\n".join(lines))


def safe_name(text: str) -> str:
    """A run id or date as one path segment."""
    return re.sub(r"[^A-Za-z0-9_.=-]", "_", text)


SCHEDULED_REPORT_DAG = "backtest_report"


def report_key(
    dag_id: str,
    run_id: str,
    logical_date: datetime | None = None,
    data_interval_end: datetime | None = None,
    run_after: datetime | None = None,
) -> str:
    """The name of a run's report folder under `<report_dir>/<dag_id>/`.

    A release keeps one folder per run; the daily report one per day (the trend reads
    the dated folders). The task that writes a report and the api-server that serves
    it both call this with the DagRun's own columns, so the server derives the folder
    itself instead of trusting a path from XCom."""
    if dag_id == SCHEDULED_REPORT_DAG:
        when = logical_date or data_interval_end or run_after
        if when is not None:
            return when.strftime("%Y-%m-%d")
    return run_id


def report_url(dag_id: str, run_id: str, base_url: str = "") -> str:
    """Where the plugin serves a run's report inside the Airflow api-server."""
    from urllib.parse import quote

    return f"{base_url.rstrip('/')}{REPORT_URL_PREFIX}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}/"


# --------------------------------------------------------------------------- detect


def detect_candidate(settings: LifecycleSettings, commit: str | None = None) -> dict | None:
    """The commit to release, or None when the tracked branch has nothing new.

    Without `commit`: the head of the tracked branch, if no earlier run decided it and
    its rules differ from the last published commit's. With `commit` (a manual run):
    that commit, always (publishing stays idempotent, so a repeat publishes nothing).
    """
    mirror = g.sync_mirror(settings.repo, settings.mirror_dir)
    explicit = bool(commit)
    try:
        sha = g.resolve(mirror, commit or settings.branch)
    except g.GitError:
        if explicit:
            raise
        log.info("Branch %s of %s has no commit yet.", settings.branch, settings.repo)
        return None
    base = audit.last_published_commit(settings.audit_dir, settings.repo, settings.branch)
    if not explicit:
        if sha in audit.processed_commits(settings.audit_dir):
            log.info("Head %s of %s was already released or decided; nothing new.", sha[:12], settings.branch)
            return None
        if any(p.get("commit") == sha for p in audit.pending_runs(settings.audit_dir, settings.repo, settings.branch)):
            log.info("Head %s of %s is being released by another run; nothing new.", sha[:12], settings.branch)
            return None
        if base and g._exists(mirror, base) and not g.paths_changed(mirror, base, sha, settings.rules_dir):
            log.info("No change under %s/ between %s and %s.", settings.rules_dir, base[:12], sha[:12])
            return None
    info = g.commit_info(mirror, sha)
    return {
        **info.to_dict(),
        # Who wrote the release: the four-eyes rule keeps them from deciding it.
        "authors": g.release_authors(mirror, base if base != sha else None, sha, settings.rules_dir),
        "base_commit": base,
        "repo": settings.repo,
        "branch": settings.branch,
        "explicit": explicit,
        "settings": settings.to_dict(),
    }


def settings_of(candidate: Mapping) -> LifecycleSettings:
    return LifecycleSettings.from_dict(candidate["settings"])


# --------------------------------------------------------------------------- supersede


def claim_release(candidate: Mapping, *, dag_id: str, run_id: str) -> dict:
    """Claim the commit for this run, then supersede the pending releases it contains.

    The claim (a `detected` record) and the check that no other pending run holds the
    same commit happen under the audit's lock: two scheduled runs whose sensors saw the
    same new commit would otherwise both ask for approval. The run that comes second
    stands down (`claimed` False, `held_by` the other run).

    A pending run (detected, not decided) of the same repository and branch whose commit
    is an ancestor of this one is superseded: this release carries its changes too, so
    approving the older one would publish a state the branch has moved past, and waiting
    for it would block a hotfix. The `superseded` record is what keeps the older run
    from publishing (`check_not_superseded`); ending its approval in Airflow is the
    DAG's job. Returns {"claimed", "held_by", "superseded": the superseded `detected`
    records}."""
    settings = settings_of(candidate)

    def held(records: list[dict]) -> dict | None:
        return next((p for p in audit.pending_in(records, settings.repo, settings.branch)
                     if p.get("commit") == candidate["commit"] and p.get("run_id") != run_id), None)

    holder = audit.append_unless(
        settings.audit_dir,
        {"event": "detected", "commit": candidate["commit"], "repo": candidate.get("repo"),
         "branch": candidate.get("branch"), "dag_id": dag_id, "run_id": run_id, "rules": []},
        held,
    )
    if holder is not None:
        return {"claimed": False, "held_by": holder.get("run_id"), "superseded": []}
    mirror = settings.mirror_dir
    older = []
    for p in audit.pending_runs(settings.audit_dir, settings.repo, settings.branch):
        if p.get("run_id") == run_id or p.get("commit") == candidate["commit"]:
            continue
        g.ensure_commit(settings.repo, mirror, p["commit"])
        if g.is_ancestor(mirror, p["commit"], candidate["commit"]):
            older.append(p)
    for p in older:
        audit.append_record(
            settings.audit_dir,
            {
                "event": "superseded",
                "commit": p["commit"],
                "repo": p.get("repo"),
                "branch": p.get("branch"),
                "dag_id": p.get("dag_id"),
                "run_id": p["run_id"],
                "superseded_by": {"commit": candidate["commit"], "run_id": run_id, "dag_id": dag_id},
                "reason": f"superseded by {candidate['short']} ({run_id})",
                "rules": [],
            },
        )
    return {"claimed": True, "held_by": run_id, "superseded": older}


def record_failure(context: Mapping) -> None:
    """DAG failure callback: close the run in the audit log (event `failed`), so a run
    that crashed or timed out waiting no longer counts as pending and its commit can be
    released again. Never raises: a callback must not mask the failure it reports."""
    from spark_jobs.lifecycle.settings import resolve_settings

    try:
        run = context.get("dag_run")
        run_id = getattr(run, "run_id", None) or context.get("run_id")
        dag_id = getattr(run, "dag_id", None) or getattr(context.get("dag"), "dag_id", None)
        if not run_id:
            return
        settings = resolve_settings()
        if any(r.get("run_id") == run_id and r.get("event") in audit.CLOSED_EVENTS for r in audit.read_records(settings.audit_dir)):
            return  # already closed (invalid, superseded, ...): that record says more
        audit.append_record(
            settings.audit_dir,
            {"event": "failed", "dag_id": dag_id, "run_id": run_id, "reason": str(context.get("reason") or "run failed"),
             "rules": []},
        )
    except Exception:  # noqa: BLE001
        log.exception("could not record the failed run in the audit log")


def superseded(candidate: Mapping, run_id: str) -> dict | None:
    """The record that superseded this run, if any (then it must not publish)."""
    return audit.superseded_by(settings_of(candidate).audit_dir, run_id)


# --------------------------------------------------------------------------- validate


def validate_candidate(candidate: Mapping, live_rules: Mapping[str, dict]) -> dict:
    """`rulectl validate --base <last published commit>` on a checkout of the commit,
    plus the version check against the live rules. Raises ValidationFailed."""
    from spark_jobs.rules.validation import validate_paths
    from spark_jobs.rules.versioning import version_bump_errors

    settings = settings_of(candidate)
    commit, base = candidate["commit"], candidate.get("base_commit")
    g.ensure_commit(settings.repo, settings.mirror_dir, commit)
    checkout = g.checkout(settings.mirror_dir, commit, settings.checkout_dir)
    rules_path = checkout / settings.rules_dir
    if not rules_path.is_dir():
        raise ValidationFailed([{"file": settings.rules_dir, "field": "-", "reason": "rules directory not found", "rule_id": None}])
    report = validate_paths([rules_path], base=base if base and base != commit else None, repo=checkout)
    errors: list[RuleError] = list(report.errors)
    seen = {(e.file, e.rule_id, e.field) for e in errors}
    for e in version_bump_errors(report.rules, dict(live_rules)):
        if (e.file, e.rule_id, e.field) not in seen:
            errors.append(
                RuleError(e.file, e.field, e.reason.replace("still", "still (as published in rules.active)"), e.rule_id)
            )
    if errors:
        raise ValidationFailed([e.to_dict() for e in errors])
    # By live id, as rules.active keys them: a rule file in mode `shadow` is the record
    # `<rule_id>@shadow`, released beside the version in force, which stays.
    rules = {lr.rule.live_id: rule_to_json_dict(lr.rule) for lr in report.rules}
    files = {lr.rule.live_id: lr.file for lr in report.rules}
    changed = sorted(rid for rid, r in rules.items() if live_rules.get(rid) != r)
    named = {base_id(rid) for rid in rules}
    removed = sorted(rid for rid in live_rules if base_id(rid) not in named)
    return {
        "ok": True,
        "checkout": str(checkout),
        "rules_path": str(rules_path),
        "rules": rules,
        "files": files,
        "changed_rule_ids": changed,
        "removed_rule_ids": removed,
        "validated_files": report.checked_files,
        "live_versions": {rid: r.get("version") for rid, r in live_rules.items()},
    }


# --------------------------------------------------------------------------- history + plan


def _rules(dicts: Mapping[str, dict]) -> list[AnyRule]:
    return [parse_rule(d) for d in dicts.values()]


def run_dir(settings: LifecycleSettings, dag_id: str, run_id: str) -> Path:
    return settings.work_dir / safe_name(dag_id) / safe_name(run_id)


def report_dir(settings: LifecycleSettings, dag_id: str, key: str) -> Path:
    return Path(settings.report_dir) / safe_name(dag_id) / safe_name(key)


def prepare_history(
    settings: LifecycleSettings,
    rules: Mapping[str, dict],
    *,
    work: Path,
    data_docs_dir: Path,
    interval_end: datetime | None = None,
) -> dict:
    """Window, slice and quality-check the history for a set of rules: the event
    archive's last `archive_lookback_hours` when the settings ask for it (or, with
    `history_source` "auto", when the table exists), else `history_inputs` files.
    `plan_history` then `check_history` in one call (the scheduled report); the release
    runs the check alongside its backtests instead."""
    history = plan_history(settings, rules, work=work, interval_end=interval_end)
    return with_quality(history, check_history(settings, rules, history, data_docs_dir=data_docs_dir))


def plan_history(
    settings: LifecycleSettings, rules: Mapping[str, dict], *, work: Path, interval_end: datetime | None = None
) -> dict:
    """The window of history the backtests read and where it is: the archive's window
    (nothing to read for that) or the window's slices of the `history_inputs` files.
    No Spark here, so the backtests and the quality check can start together."""
    rule_objs = _rules(rules)
    if use_archive(settings):
        return _archive_plan(settings, rule_objs, interval_end=interval_end)
    inputs = dict(settings.history_inputs)
    missing = [f"{t}={p}" for t, p in inputs.items() if not Path(p).exists()]
    if missing:
        raise FileNotFoundError(f"history input(s) not found: {', '.join(missing)}")
    window = compute_window(
        inputs,
        rule_objs,
        time_field=settings.time_field,
        lookback_hours=settings.history_lookback_hours,
        anchor=settings.history_window_end,
        interval_end=interval_end,
    )
    sliced = slice_inputs(
        inputs, rule_objs, window, work / "history", time_field=settings.time_field, enabled=settings.history_slice
    )
    return {
        "window": window.to_dict(),
        "window_ms": {t: list(w) for t, w in window.per_topic.items()},
        "inputs": {t: s["path"] for t, s in sliced.items()},
        "slices": sliced,
    }


def check_history(settings: LifecycleSettings, rules: Mapping[str, dict], history: Mapping, *, data_docs_dir: Path) -> dict:
    """The Great Expectations result (and Data Docs) of a planned history
    (`plan_history`): on Spark over the archive's window, else pandas over the slices."""
    from spark_jobs.quality import run_quality

    rule_objs = _rules(rules)
    shutil.rmtree(data_docs_dir, ignore_errors=True)
    archive = history["inputs"].get(ARCHIVE_INPUT)
    if archive is not None:
        return _archive_quality(settings, rule_objs, archive, data_docs_dir=data_docs_dir)
    return run_quality(
        history["inputs"],
        rule_objs,
        time_field=settings.time_field,
        window_ms={t: (int(a), int(b)) for t, (a, b) in (history.get("window_ms") or {}).items()},
        data_docs_dir=data_docs_dir,
    )


def with_quality(history: Mapping, quality: Mapping) -> dict:
    """A planned history with its quality result; an archive slice takes its record
    count from the check (the one pass that reads the window in full)."""
    slices = {}
    for t, s in (history.get("slices") or {}).items():
        counted = ((quality.get("topics") or {}).get(t) or {}).get("records")
        slices[t] = {**s, "records": counted} if s.get("records") is None and counted is not None else dict(s)
    return {**history, "slices": slices, "quality": dict(quality)}


# The key of a plan's `inputs` that names an archive window instead of topic files (no
# Kafka topic can be called this: `@` is not allowed in topic names).
ARCHIVE_INPUT = "@archive"


def use_archive(settings: LifecycleSettings) -> bool:
    """Whether a backtest of these settings reads the event archive."""
    if settings.history_source == "files":
        return False
    there = (Path(settings.archive_table) / "_delta_log").is_dir()
    if settings.history_source == "archive" and not there:
        raise FileNotFoundError(f"history_source is 'archive' but {settings.archive_table} is not a Delta table")
    return there


def _rule_topics(rules: list[AnyRule]) -> list[str]:
    return sorted({r.source_topic for r in rules} | {getattr(r, "context_topic", None) for r in rules} - {None})


def _archive_plan(settings: LifecycleSettings, rules: list[AnyRule], *, interval_end: datetime | None) -> dict:
    """The archive's window [end - archive_lookback_hours, end) by broker timestamp;
    the backtests and the quality check read the same window."""
    from datetime import UTC, timedelta

    end = (interval_end or datetime.now(UTC)).astimezone(UTC)
    start = end - timedelta(hours=settings.archive_lookback_hours)
    topics = _rule_topics(rules)
    start_iso = start.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    end_iso = end.isoformat(timespec="milliseconds").replace("+00:00", "Z")
    window = {"start": start_iso, "end": end_iso, "anchor": "archive",
              "topics": {t: {"start": start_iso, "end": end_iso} for t in topics}}
    inputs = {ARCHIVE_INPUT: {"table": settings.archive_table, "from": start_iso, "to": end_iso}}
    slices = {t: {"path": f"{settings.archive_table}#topic={t}", "records": None} for t in topics}
    return {"window": window, "inputs": inputs, "slices": slices}


def history_session(settings: LifecycleSettings, app_name: str = "history-quality"):  # -> SparkSession
    """The Spark the quality check runs on: the platform's warm Spark Connect server
    when there is one (`LifecycleSettings.remote_url`), else a local session in this
    process (a JVM start and a cold JIT: what a warm server saves)."""
    from spark_jobs.spark import remote_session, session

    url = settings.remote_url()
    if url:
        try:
            return remote_session(url)
        except Exception:  # noqa: BLE001 - any failure to reach it: run here instead
            log.warning("Spark Connect server %s did not answer; starting a local Spark session", url, exc_info=True)
    return session(app_name, master=settings.spark_master, extra=settings.spark_conf)


def _archive_quality(settings: LifecycleSettings, rules: list[AnyRule], archive: Mapping, *, data_docs_dir: Path) -> dict:
    """Great Expectations on Spark over the archive's window (`archive` as planned)."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    from spark_jobs.archive.table import engine_input, parse_time, read_window
    from spark_jobs.engine.events import with_reasons
    from spark_jobs.quality.spark_runner import run_quality_spark

    topics = _rule_topics(rules)
    spark = history_session(settings)
    try:
        start, end = parse_time(archive["from"]), parse_time(archive["to"])
        rows = with_reasons(engine_input(read_window(spark, archive["table"], start, end, topics)))
        frames = {t: rows.filter(rows.topic == t) for t in topics}
        return run_quality_spark(frames, rules, time_field=settings.time_field, data_docs_dir=data_docs_dir,
                                 source=archive["table"], collect_max_rows=settings.quality_collect_max_rows)
    finally:
        if isinstance(spark, ConnectSession):
            spark.stop()  # ends this client's session on the shared server, not the server


def write_rules_dir(rules: Mapping[str, dict], target: Path) -> Path:
    """A rules directory (one JSON file per rule) the backtest can read."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for rid, rule in rules.items():
        (target / f"{safe_name(rid)}.json").write_text(json.dumps(rule, indent=2), encoding="utf-8")
    return target


def plan_release_backtests(
    candidate: Mapping, validation: Mapping, live_rules: Mapping[str, dict], *, dag_id: str, run_id: str
) -> dict:
    """The history window and the two backtests to run (candidate and live versions).
    The history's quality check is `check_release_history`, run next to the backtests:
    it reads the same window and decides nothing they need."""
    settings = settings_of(candidate)
    work = run_dir(settings, dag_id, run_id)
    rdir = report_dir(settings, dag_id, run_id)
    changed = list(validation["changed_rule_ids"])
    history = plan_history(settings, validation["rules"], work=work)
    cand_rules = write_rules_dir(validation["rules"], work / "candidate_rules")
    # The published side is the versions in force (a backtest runs one version of a rule).
    pub_rules = write_rules_dir({k: v for k, v in live_rules.items() if base_id(k) == k}, work / "published_rules")
    # Both backtests run on the platform's warm Spark when it has one (no JVM start, a
    # JIT that has seen the engine's plans); the spec carries it to `backtest_args`.
    remote = settings.remote_url()
    return {
        **history,
        "work_dir": str(work),
        "report_dir": str(rdir),
        "candidate": {
            "rules_dir": str(cand_rules),
            "only": sorted({base_id(rid) for rid in changed}),
            "out_dir": str(work / "backtest_candidate"),
            "remote": remote,
        },
        "published": {
            "rules_dir": str(pub_rules),
            "only": sorted({base_id(rid) for rid in changed if base_id(rid) in live_rules}),
            "out_dir": str(work / "backtest_published"),
            "remote": remote,
        },
        "time_field": settings.time_field,
        "sink_topic": settings.sink_topic,
    }


def check_release_history(candidate: Mapping, validation: Mapping, plan: Mapping) -> dict:
    """The quality check of a release's planned history (`plan_release_backtests`), its
    Data Docs next to the report."""
    settings = settings_of(candidate)
    return check_history(settings, validation["rules"], plan, data_docs_dir=Path(plan["report_dir"]) / "data_docs")


def backtest_args(spec: Mapping, inputs: Mapping[str, str], time_field: str, sink_topic: str) -> list[str]:
    """Arguments of the backtest application (`spark_jobs/backtest/submit.py`) for one
    side of a plan ({"rules_dir", "out_dir", "only", and "remote": a Spark Connect server or None)."""
    args = ["--rules", spec["rules_dir"], "--out", spec["out_dir"], "--time-field", time_field, "--sink-topic", sink_topic]
    archive = inputs.get(ARCHIVE_INPUT)
    if archive is not None:
        args += ["--history", archive["table"], "--from", archive["from"], "--to", archive["to"]]
    for topic, path in sorted(inputs.items()):
        if topic != ARCHIVE_INPUT:
            args += ["--input", f"{topic}={path}"]
    for rule_id in spec.get("only") or []:
        args += ["--only", rule_id]
    if spec.get("remote"):
        args += ["--remote", spec["remote"]]
    return args


# --------------------------------------------------------------------------- report


def _time_fields(rules: Mapping[str, dict]) -> dict[str, str | None]:
    return {rid: r.get("timestamp_field") for rid, r in rules.items()}


def build_release_report(
    candidate: Mapping,
    validation: Mapping,
    plan: Mapping,
    live_rules: Mapping[str, dict],
    *,
    dag_id: str,
    run_id: str,
    base_url: str = "",
) -> dict:
    """Write report.json/report.html; returns paths, URL and the approval page text."""
    settings = settings_of(candidate)
    changed = list(validation["changed_rule_ids"])
    rules = validation["rules"]
    tfields = {**_time_fields(live_rules), **_time_fields(rules)}
    cand = load_backtest(plan["candidate"]["out_dir"], "candidate", tfields, settings.time_field)
    pub = load_backtest(plan["published"]["out_dir"] if plan["published"]["only"] else None, "published", tfields, settings.time_field)
    # A shadow is compared with the version in force of its rule.
    changes = [RuleChange(base_id(rid), rules.get(rid), live_rules.get(base_id(rid))) for rid in changed]
    ctx = {
        "commit": candidate["commit"],
        "commit_subject": candidate.get("subject"),
        "author": candidate.get("author"),
        "base_commit": candidate.get("base_commit") or "none recorded",
        "branch": candidate.get("branch"),
        "repo": candidate.get("repo"),
        "dag_id": dag_id,
        "run_id": run_id,
    }
    quality = dict(plan["quality"])
    quality["data_docs"] = "data_docs/index.html"
    report = build_report(
        kind="release",
        title=f"Rule release {candidate['short']}: {', '.join(changed) or 'no changes'}",
        candidate=cand,
        published=pub,
        rules=changes,
        quality=quality,
        window=plan["window"],
        context=ctx,
        max_rows=settings.report_max_rows,
    )
    paths = write_report(report, plan["report_dir"])
    url = report_url(dag_id, run_id, base_url)
    checksums = report_checksums(plan["report_dir"])
    report["authors"] = list(candidate.get("authors") or [])
    report["promotes"] = list(validation.get("promotes") or [])
    report["watermark"] = watermark_change(live_rules, rules, changed)
    return {
        **paths,
        "dir": plan["report_dir"],
        "url": url,
        "sha256": checksums,
        "quality_ok": bool(quality.get("success")),
        "subject": f"Publish {len(changed)} rule change(s) from {candidate['short']} to {settings.rules_topic}?",
        "approval_body": approval_body(report, url, settings.rules_topic, checksums),
        "summary": [
            {k: r.get(k) for k in ("rule_id", "status", "published_version", "candidate_version", "added", "removed")}
            for r in report["rules"]
        ],
    }


_MD_PUNCTUATION = re.compile(r"""([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~])""")


def md_text(value: object) -> str:
    """`value` as literal text inside Markdown: every ASCII punctuation character is
    backslash-escaped (CommonMark allows it for all of them) and line breaks become
    spaces, so a commit subject or author cannot add links, emphasis, HTML, table cells
    or lines to what the approver reads."""
    text = " ".join(str(value if value is not None else "").split())
    return _MD_PUNCTUATION.sub(r"\\\1", text)


def md_code(value: object) -> str:
    """`value` as an inline code span it cannot close (backslashes are literal there)."""
    text = " ".join(str(value if value is not None else "").split())
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    return f"{fence} {text} {fence}" if longest else f"`{text}`"


def md_cell(value: object) -> str:
    """`value` as a code span inside a GFM table cell (where `\\|` is a literal pipe)."""
    return md_code(value).replace("|", "\\|")


def md_fence(body: str, info: str = "") -> list[str]:
    """A fenced code block that `body` cannot close: the fence is longer than any
    run of backticks inside it."""
    longest = max((len(m) for m in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return [fence + info, body, fence]


def report_checksums(report_dir: str | Path) -> dict[str, str]:
    """SHA-256 of report.html and report.json: what the approver saw, for the audit."""
    import hashlib

    out = {}
    for name in ("report.html", "report.json"):
        f = Path(report_dir) / name
        if f.is_file():
            out[name] = hashlib.sha256(f.read_bytes()).hexdigest()
    return out


def _parsed(docs: Iterable[Mapping]) -> list[AnyRule]:
    """The rule documents the engine can load (a live document it cannot parse adds
    nothing to the job's watermark: the job does not run it)."""
    out = []
    for d in docs:
        try:
            out.append(parse_rule(d))
        except ValueError:
            continue
    return out


def _watermark_contribution(rule: Mapping | None) -> float | None:
    """The delay a rule document adds to the detection job's watermark (None: none)."""
    parsed = _parsed([rule]) if rule is not None else []
    return parsed[0].watermark_delay_s if parsed and parsed[0].enabled else None


def watermark_change(
    live_rules: Mapping[str, dict], candidate_rules: Mapping[str, dict], changed: list[str]
) -> dict | None:
    """What publishing `changed` does to the detection job's watermark delay, or None
    when no changed rule touches it.

    The job runs with one watermark delay, the largest of its enabled event-time rules'
    (`job_watermark_delay_s`), fixed while it runs: when the published rules need
    another, the job reports `restart_required` and the detection supervisor has its
    runner restart it (spark_jobs/streaming/job.py StatusReporter, dags/
    detection_supervisor.py); a rule's own delay may change without moving the job's.
    Returns {"before", "after", "restart", "rules": [{"rule_id", "before", "after"}]}."""
    from spark_jobs.rules.model import job_watermark_delay_s

    published = {rid: live_rules.get(rid) for rid in changed}
    after_set = {**live_rules, **{rid: candidate_rules[rid] for rid in changed}}
    rules = []
    for rid in changed:
        was, will = _watermark_contribution(published[rid]), _watermark_contribution(candidate_rules[rid])
        if was != will:
            rules.append({"rule_id": rid, "before": was, "after": will})
    before = job_watermark_delay_s(_parsed(live_rules.values()))
    after = job_watermark_delay_s(_parsed(after_set.values()))
    if not rules and before == after:
        return None
    return {"before": before, "after": after, "restart": before != after, "rules": rules}


def _seconds(value: float | None) -> str:
    return "none" if value is None else f"{value:g}s"


def watermark_lines(change: Mapping | None) -> list[str]:
    """The approval page's words on a watermark change (Markdown; rule ids as code)."""
    if not change:
        return []
    rules = ", ".join(f"{md_code(r['rule_id'])} ({_seconds(r['before'])} → {_seconds(r['after'])})"
                      for r in change["rules"])
    if not change["restart"]:
        return [
            f"ℹ️ Watermark delay changes: {rules}. The detection job's watermark delay stays "
            f"{_seconds(change['after'])} (the largest of the enabled event-time rules'), so the live job "
            "keeps running.",
            "",
        ]
    return [
        f"⚠️ **Approving restarts the live detection job.** Its watermark delay (the largest of the enabled "
        f"event-time rules') goes from {_seconds(change['before'])} to {_seconds(change['after'])} through "
        f"{rules}. The job holds one watermark delay for as long as it runs, so once these rules are live "
        "the detection supervisor (DAG `detection_supervisor`) has the job's runner restart it on its "
        "checkpoint (with its `restart_enabled` off it alerts instead, and an operator restarts the job).",
        "",
        "**Detections pause while the job restarts**, for every rule, not only these: they resume when the "
        "job's status reads `running` again (field `state` of the job's records on the `detect.status` "
        "topic, `rulectl tail detect.status`; the supervisor's `confirm_restart` task waits for it).",
        "",
    ]


def approval_body(report: dict, url: str, topic: str, checksums: Mapping[str, str] | None = None) -> str:
    """Markdown for the approval page: what changes, what it would have caught, the diff.

    Everything that comes from git or a rule file (subject, author, rule ids,
    versions, the diff) is a code span (`md_code`, `md_cell`) or fenced (`md_fence`):
    a commit message must not be able to forge what the approver reads. Code, not
    backslash-escaped text, because the UI's renderer (GitHub-flavoured Markdown)
    turns bare URLs and e-mail addresses into links even when escaped."""
    ctx = report["context"]
    base = ctx.get("base_commit")
    lines = [
        f"**Commit** {md_code(str(ctx['commit'])[:12])} by {md_code(ctx.get('author'))}: "
        f"{md_code(ctx.get('commit_subject'))}  ",
        f"Last published commit: {md_code(str(base)[:15])} · approving publishes to {md_code(topic)}.",
        "",
        f"**[Open the backtest report]({url})** (plots, alerts added/removed, data quality, Data Docs)",
        "",
    ]
    authors = sorted(
        {f"{a.get('author')} <{a.get('email')}>" for a in report.get("authors") or []}
        | {f"{a.get('committer')} <{a.get('committer_email')}>" for a in report.get("authors") or [] if a.get("committer_email")}
    )
    if authors:
        lines += [
            f"**Four eyes:** only a Rule approver who wrote none of this release's commits may decide it; "
            f"not eligible: {', '.join(md_code(a) for a in authors)}.",
            "",
        ]
    for p in report.get("promotes") or []:
        by = (p.get("shadow_approved_by") or {}).get("name")
        lines += [
            f"**Promotion:** puts in force {md_code(p['rule_id'])} v{md_code(p['version'])}, the version its "
            f"shadow runs" + (f", released as a shadow by {md_code(by)}, who may not decide this one: "
                              "a second approver must." if by else "."),
            "",
        ]
    lines += [
        "**Release as** (a field of this form): *active* puts the candidate in force in place of the live "
        "version; *shadow* runs it beside the live version on the same events, its detections going to "
        f"{md_code('events.shadow')} only, never to the sink ({md_code('rulectl shadow RULE_ID')} compares them). "
        "Making a shadow the version in force is a release of its own, approved like this one.",
        "",
    ]
    lines += watermark_lines(report.get("watermark"))
    if checksums and checksums.get("report.html"):
        lines += [f"Report checksum (SHA-256 of report.html): {md_code(checksums['report.html'])}", ""]
    for m in report.get("marks", []):
        icon = {"error": "⛔", "warning": "⚠️"}.get(m["level"], "ℹ️")
        lines.append(f"{icon} {md_text(m['text'])}  ")
    lines += [
        "",
        "| rule | published | candidate | alerts (published → candidate) | added | removed |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["rules"]:
        p, c = r.get("published") or {}, r.get("candidate") or {}
        cells = [
            r["rule_id"], r.get("published_version") or "–", r.get("candidate_version") or "–",
            f"{p.get('detections', '–')} → {c.get('detections', '–')}", r.get("added", 0), r.get("removed", 0),
        ]
        lines.append("| " + " | ".join(md_cell(x) for x in cells) + " |")
    lines.append("")
    for r in report["rules"]:
        lines += [f"**Rule diff:** {md_code(r['rule_id'])}", *md_fence((r.get("diff") or "").rstrip(), "diff"), ""]
    return "\n".join(lines)


# --------------------------------------------------------------------------- publish + audit


def audit_records(candidate: Mapping) -> list[dict]:
    """The release audit's records, from the candidate's settings."""
    return audit.read_records(settings_of(candidate).audit_dir)


def shadow_promotions(validation: Mapping, live_rules: Mapping[str, dict], records: Iterable[Mapping]) -> list[dict]:
    """The shadows this release would put in force: each changed rule whose candidate
    version is the version its shadow runs on `rules.active`, with who approved that
    shadow's release (the audit's newest `published` record of it; None for a shadow
    no approval released). That approver may not decide the promotion: a second one
    must (spark_jobs.lifecycle.governance.refusal)."""
    published = [r for r in records if r.get("event") == "published"]
    out = []
    for rid in validation["changed_rule_ids"]:
        version = validation["rules"][rid].get("version")
        shadow = live_rules.get(shadow_id(base_id(rid)))
        if rid != base_id(rid) or not shadow or shadow.get("version") != version:
            continue
        by = next((rec.get("approved_by") for rec in reversed(published)
                   if any(e.get("rule_id") == rid and e.get("mode") == "shadow" and e.get("version") == version
                          for e in rec.get("rules") or [])), None)
        out.append({"rule_id": rid, "version": version, "shadow_approved_by": by})
    return out


def rules_to_publish(validation: Mapping) -> list[dict]:
    """The candidate versions of the changed rules, in a stable order."""
    return [validation["rules"][rid] for rid in validation["changed_rule_ids"]]


def approval_outcome(payload: Mapping | None) -> dict:
    """Normalise the approval task's result (Airflow's HITL response)."""
    payload = payload or {}
    chosen = list(payload.get("chosen_options") or [])
    user = payload.get("responded_by_user") or payload.get("responded_by") or {}
    at = payload.get("responded_at")
    params = payload.get("params_input") or {}
    return {
        "approved": chosen == ["Approve"],
        "chosen": chosen,
        "by": {"id": user.get("id"), "name": user.get("name")} if user else None,
        "at": at.isoformat() if hasattr(at, "isoformat") else at,
        "comment": params.get("comment") or None,
        "release_as": "shadow" if params.get("release_as") == "shadow" else "active",
    }


def record_decision(
    candidate: Mapping,
    validation: Mapping | None,
    *,
    event: str,
    dag_id: str,
    run_id: str,
    approval: Mapping | None = None,
    published: Mapping | None = None,
    report: str | None = None,
    report_sha256: Mapping[str, str] | None = None,
    reason: str | None = None,
    errors: list[dict] | None = None,
) -> dict:
    """Append the run's decision to the audit log; returns the record."""
    settings = settings_of(candidate)
    live = (validation or {}).get("live_versions") or {}
    produced = set((published or {}).get("published") or [])
    # Released as a shadow by the approver's choice: every rule's record is its shadow's.
    as_shadow = (published or {}).get("mode") == "shadow"
    rules = []
    if validation:
        for rid in validation.get("changed_rule_ids", []):
            mode = "shadow" if as_shadow else validation["rules"][rid].get("mode", "active")
            key = shadow_id(base_id(rid)) if mode == "shadow" else rid
            rules.append(
                {
                    "rule_id": base_id(rid),
                    "mode": mode,
                    "version": validation["rules"][rid].get("version"),
                    "previous_version": live.get(base_id(rid)),
                    "file": (validation.get("files") or {}).get(rid),
                    "produced": key in produced if event == "published" else False,
                    # Where the record went on rules.active (the evidence chain reads it back).
                    **((published or {}).get("offsets") or {}).get(key, {}),
                }
            )
    approval = dict(approval or {})
    rec = {
        "event": event,
        "commit": candidate["commit"],
        "base_commit": candidate.get("base_commit"),
        "repo": candidate.get("repo"),
        "branch": candidate.get("branch"),
        "dag_id": dag_id,
        "run_id": run_id,
        "rules_topic": settings.rules_topic,
        "rules": rules,
        "approved_by": approval.get("by") if event == "published" else None,
        "decided_by": approval.get("by"),
        "decided_at": approval.get("at"),
        "comment": approval.get("comment"),
        "release_as": approval.get("release_as") if event == "published" else None,
        "report": report,
        "report_sha256": report_sha256,
        "authors": sorted({a.get("email") for a in candidate.get("authors") or [] if a.get("email")}),
        "reason": reason,
        "errors": errors,
        "unchanged": sorted((published or {}).get("unchanged") or []),
    }
    return audit.append_record(settings.audit_dir, rec)
