"""The evidence chain of one detection: which event, rule text, commit, report, approval
and publish made it, each link read from its own source and checked there.

A detection names its rule and version (`rule_id`, `rule_version`). A version names one
release: the release path refuses a changed rule without a higher version, and the job
refuses a record that reuses a version with another text (spark_jobs/streaming/
registry.py). So the audit's `published` record of that version is the release, and
from it every other link is found and checked against the place it lives:

- the detection: the sink topic, found by its id;
- the event: the archive's record whose SHA-256 with the rule and version (the
  detection id's definition, docs/rule-language.md) is the detection id;
- the rule text: the record the release put on `rules.active`, at the partition and
  offset the audit kept, with the release's commit in its headers;
- the commit: git; the rule file at that commit must give the same text;
- the report: the file the approver was shown, whose SHA-256 the audit kept;
- the approval: the audit (Airflow's own human-in-the-loop response, copied there);
- the first detection of the version: the sink topic again;
- the replay: a backtest of that rule text over the archived events up to the event.

Every link is one `Link`: what it says and whether its check held (True), failed
(False) or could not be made (None, with the reason).
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from spark_jobs.kafka.admin import KafkaRecord, read_all
from spark_jobs.kafka.publisher import canonical_json
from spark_jobs.rules.model import shadow_id

SEP = "\u001f"
READER = "reader"
DETECTION_ID = re.compile(r"^[0-9a-f]{32}$")


@dataclass
class Link:
    name: str
    ok: bool | None
    facts: dict = field(default_factory=dict)
    check: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Chain:
    detection_id: str
    links: list[Link] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every link checked and held."""
        return bool(self.links) and all(link.ok is True for link in self.links)

    def link(self, name: str) -> Link | None:
        return next((x for x in self.links if x.name == name), None)

    def to_dict(self) -> dict:
        return {"detection_id": self.detection_id, "ok": self.ok, "links": [x.to_dict() for x in self.links]}


def spec_detection_id(rule_id: str, version: str, topic: str, raw: bytes) -> str:
    """The detection id as the detection record's spec defines it: the first 32 hex
    characters of SHA-256 over rule id, version, topic and event text, joined by U+001F."""
    text = SEP.join([rule_id, version, topic, raw.decode("utf-8", errors="replace")])
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _where(rec: KafkaRecord) -> dict:
    return {"topic": rec.topic, "partition": rec.partition, "offset": rec.offset, "broker_time": _iso(rec.timestamp_ms)}


# --------------------------------------------------------------------------- the sink


@dataclass
class Found:
    """The detection on the sink and the first detection of its rule version."""

    record: KafkaRecord
    doc: dict
    first: KafkaRecord
    first_doc: dict


def find_detection(records: Iterable[KafkaRecord], detection_id: str) -> Found | None:
    """The detection with this id among the sink's records, and the earliest (broker
    time, then partition and offset) detection of the same rule version."""
    records = list(records)
    needle = f'"detection_id":"{detection_id}"'.encode()
    target = None
    for rec in records:
        if rec.value is not None and needle in rec.value:
            doc = _doc(rec)
            if doc is not None and doc.get("detection_id") == detection_id:
                target = (rec, doc)
                break
    if target is None:
        return None
    rec, doc = target
    version_bytes = ('"rule_version":' + json.dumps(doc.get("rule_version"))).encode()
    first = None
    for other in records:
        if other.value is None or version_bytes not in other.value:
            continue
        odoc = _doc(other)
        if odoc is None or (odoc.get("rule_id"), odoc.get("rule_version")) != (doc.get("rule_id"), doc.get("rule_version")):
            continue
        if first is None or (other.timestamp_ms, other.partition, other.offset) < (
                first[0].timestamp_ms, first[0].partition, first[0].offset):
            first = (other, odoc)
    assert first is not None  # the detection itself qualifies
    return Found(rec, doc, first[0], first[1])


def _doc(rec: KafkaRecord) -> dict | None:
    try:
        doc = json.loads(rec.value or b"")
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def detection_link(found: Found) -> Link:
    doc, rec = found.doc, found.record
    key = (rec.key or b"").decode(errors="replace")
    ok = key == doc.get("rule_id")
    return Link(
        "detection", ok,
        {**_where(rec), "rule_id": doc.get("rule_id"), "rule_version": doc.get("rule_version"),
         "rule_type": doc.get("rule_type"), "processed": doc.get("processed")},
        "record key is the rule id" if ok else f"record key {key!r} is not the rule id {doc.get('rule_id')!r}",
    )


def first_link(found: Found) -> Link:
    return Link(
        "first detection of the version", True,
        {**_where(found.first), "detection_id": found.first_doc.get("detection_id"),
         "processed": found.first_doc.get("processed"), "is_this_one": found.first is found.record},
        "earliest record of this rule version on the sink (broker time)",
    )


# --------------------------------------------------------------------------- the release


def release_record(records: Iterable[Mapping], rule_id: str, version: str,
                   mode: str = "active") -> tuple[dict, dict] | None:
    """The audit's `published` record that produced this rule version in this mode (a
    shadow detection's release is the shadow's), and its rule entry."""
    for rec in reversed(list(records)):
        if rec.get("event") != "published":
            continue
        for entry in rec.get("rules") or []:
            if (entry.get("rule_id") == rule_id and str(entry.get("version")) == str(version) and entry.get("produced")
                    and entry.get("mode", "active") == mode):
                return dict(rec), dict(entry)
    return None


def event_text(detection: bytes, rule_id: str) -> str:
    """The event's text inside a detection: what comes before the rule's members, which
    start with `"rule_id":` and its id (the detection record's spec); a trailing comma
    and blanks cut, the closing brace not included."""
    text = detection.decode("utf-8", errors="replace")
    head = f'"rule_id":{json.dumps(rule_id, ensure_ascii=False)},"rule_version":'
    cut = text.rfind(head)
    return text[:cut].rstrip().rstrip(",") if cut > 0 else ""


def rule_text_link(rules_records: list[KafkaRecord], rules_topic: str, release: Mapping, entry: Mapping) -> tuple[Link, dict | None]:
    """The rules.active record the release produced, and its rule document."""
    partition, offset = entry.get("partition"), entry.get("offset")
    version = str(entry["version"])
    # The record key: the rule id, or `<rule_id>@shadow` for a shadow version.
    rule_id = shadow_id(entry["rule_id"]) if entry.get("mode") == "shadow" else entry["rule_id"]
    if partition is None or offset is None:
        # An audit record written before the publish kept offsets: find the record.
        cands = [r for r in rules_records if (r.key or b"").decode() == rule_id and _version(r) == version]
        if not cands:
            return Link("rule version", False, {"topic": rules_topic}, f"no record of {rule_id} v{version} on {rules_topic}"), None
        rec, how = cands[0], "found by key and version (the audit record has no offset)"
    else:
        rec = next((r for r in rules_records if r.partition == partition and r.offset == offset), None)
        if rec is None:
            return Link("rule version", False, {"topic": rules_topic, "partition": partition, "offset": offset},
                        f"{rules_topic} has no record at partition {partition} offset {offset} (compacted away?)"), None
        how = "the audit's partition and offset"
    doc = _doc(rec)
    problems = []
    if (rec.key or b"").decode(errors="replace") != rule_id:
        problems.append(f"key {rec.key!r} is not {rule_id!r}")
    if doc is None or str(doc.get("version")) != version:
        problems.append(f"the record holds version {None if doc is None else doc.get('version')!r}, not {version!r}")
    header_commit = (rec.header("commit") or b"").decode() or None
    if release.get("commit") and header_commit != release.get("commit"):
        problems.append(f"its commit header {header_commit!r} is not the release's {release.get('commit')!r}")
    facts = {**_where(rec), "rule": doc, "commit_header": header_commit,
             "published_by": (rec.header("published_by") or b"").decode() or None,
             "published_at": (rec.header("published_at") or b"").decode() or None}
    check = f"read at {how}: key, version and commit header match" if not problems else "; ".join(problems)
    return Link("rule version", not problems, facts, check), doc


def _version(rec: KafkaRecord) -> str | None:
    doc = _doc(rec)
    return None if doc is None else str(doc.get("version"))


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)


def commit_link(repo: Path | None, release: Mapping, entry: Mapping, rule: Mapping | None) -> Link:
    """The commit (git), its author, and the rule file at it: the same text as the record."""
    from spark_jobs.lifecycle.bootstrap import load_at_commit
    from spark_jobs.rules.model import rule_to_json_dict

    commit = release.get("commit")
    facts: dict = {"commit": commit, "release_authors": release.get("authors") or [], "file": entry.get("file")}
    if not commit:
        return Link("commit", None, facts, "the release names no commit (rules published from a folder outside git)")
    if repo is None or _git(repo, "rev-parse", "--git-dir").returncode != 0:
        return Link("commit", None, facts, f"no git repository to read (looked at {repo})")
    shown = _git(repo, "show", "-s", "--format=%H%x1f%an%x1f%ae%x1f%aI%x1f%s", commit)
    if shown.returncode != 0:
        return Link("commit", False, {**facts, "repo": str(repo)}, f"git does not know {commit}: {shown.stderr.strip()}")
    sha, name, email, when, subject = shown.stdout.strip().split("\x1f", 4)
    facts.update({"repo": str(repo), "author": f"{name} <{email}>", "authored_at": when, "subject": subject})
    rules_dir = Path(entry["file"]).parts[0] if entry.get("file") else "rules"
    loaded = load_at_commit(repo / rules_dir, commit)
    at_commit = next((lr for lr in loaded.rules if lr.rule.rule_id == entry["rule_id"]), None)
    if at_commit is None:
        return Link("commit", False, facts, f"{entry['rule_id']} is not in {rules_dir}/ at {commit[:12]}")
    facts["file"] = at_commit.file
    if rule is None:
        return Link("commit", None, facts, "no rule record to compare the file with")
    # Released as a shadow by the approver's choice, the record is the file's rule in mode
    # shadow (the publish task sets it): compare with what the publish made of the file.
    published = at_commit.rule.model_copy(update={"mode": entry.get("mode", "active")})
    same = canonical_json(rule_to_json_dict(published)) == canonical_json(rule)
    return Link("commit", same, facts,
                f"{at_commit.file} at {commit[:12]} is the published text" if same
                else f"{at_commit.file} at {commit[:12]} differs from the record on rules.active")


def report_link(release: Mapping) -> Link:
    """The report the approver was shown: its file's SHA-256 against the audit's."""
    path = release.get("report")
    kept = (release.get("report_sha256") or {}).get("report.html")
    facts = {"report": path, "sha256": kept}
    if release.get("bootstrap"):
        return Link("backtest report", None, facts, "a bootstrap at platform start: no report, no approval")
    if not path or not kept:
        return Link("backtest report", False, facts, "the audit record names no report or checksum")
    f = Path(path)
    if not f.is_file():
        return Link("backtest report", False, facts, f"{path} is gone")
    now = hashlib.sha256(f.read_bytes()).hexdigest()
    return Link("backtest report", now == kept, {**facts, "sha256_now": now},
                "SHA-256 of the file matches the audit" if now == kept else "the file changed since the approval")


def approval_link(release: Mapping) -> Link:
    by = release.get("approved_by") or {}
    facts = {"approver": by.get("name") or by.get("id"), "approver_id": by.get("id"), "at": release.get("decided_at"),
             "comment": release.get("comment"), "dag_id": release.get("dag_id"), "run_id": release.get("run_id"),
             "authors": release.get("authors") or []}
    if release.get("bootstrap"):
        return Link("approval", None, facts, release.get("reason") or "a bootstrap: approved by nobody")
    ok = bool(facts["approver"]) and bool(facts["at"])
    return Link("approval", ok, facts, "the release audit's published record (Airflow's approval response)" if ok
                else "the published record names no approver or time")


def publish_link(release: Mapping, rule_link: Link) -> Link:
    facts = {k: rule_link.facts.get(k) for k in ("topic", "partition", "offset", "broker_time", "published_by", "published_at")}
    facts["audit_recorded_at"] = release.get("recorded_at")
    ok = rule_link.ok is True and facts["offset"] is not None
    return Link("publish", ok, facts, "the record is on the rules topic where the audit says" if ok else rule_link.check)


# --------------------------------------------------------------------------- the event


def event_link(spark: object, table: str | None, found: Found, rule: Mapping | None) -> tuple[Link, dict | None]:
    """The archived event whose SHA-256 with the rule and version is the detection id."""
    doc = found.doc
    topic = (rule or {}).get("source_topic")
    if not table or not (Path(table) / "_delta_log").is_dir():
        return Link("event", None, {"archive": table}, "no event archive to read"), None
    if topic is None:
        return Link("event", None, {"archive": table}, "no rule text, so no source topic"), None
    from pyspark.sql import functions as F

    from spark_jobs.archive.table import read_window

    body = event_text(found.record.value or b"", doc["rule_id"])
    seen = found.record.timestamp_ms
    start = datetime.fromtimestamp(seen / 1000, UTC) - timedelta(days=2)
    end = datetime.fromtimestamp(seen / 1000, UTC) + timedelta(seconds=1)
    rows = read_window(spark, table, start, end, [topic])  # type: ignore[arg-type]
    if body:
        rows = rows.filter(F.col("value").cast("string").startswith(body))
    cands = rows.select("topic", "partition", "offset", "timestamp", "value").limit(1000).collect()
    for row in cands:
        raw = bytes(row["value"])
        if spec_detection_id(doc["rule_id"], str(doc["rule_version"]), row["topic"], raw) == found.doc["detection_id"]:
            facts = {"topic": row["topic"], "partition": row["partition"], "offset": row["offset"],
                     "broker_time": row["timestamp"].astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                     "event": raw.decode("utf-8", errors="replace"), "archive": table}
            return Link("event", True, facts, "SHA-256 of rule, version, topic and this event is the detection id"), facts
    return Link("event", False, {"archive": table, "candidates": len(cands)},
                f"no archived record of {topic} hashes to the detection id (not archived yet?)"), None


def replay_link(spark: object, table: str | None, rule: Mapping | None, event: Mapping | None, detection_id: str,
                *, time_field: str = "timestamp") -> Link:
    """A backtest of the rule text over the archive up to the event gives the same id."""
    if rule is None or event is None or not table:
        return Link("replay", None, {}, "needs the rule text and the archived event")
    from spark_jobs.archive.table import parse_time
    from spark_jobs.backtest.runner import BacktestConfig, HistoryWindow, run_backtest
    from spark_jobs.rules.model import parse_rule

    parsed = parse_rule(dict(rule))
    span_ms = max(getattr(parsed, "window_ms", 0) or 0, 1000) + int((parsed.watermark_delay_s or 0) * 1000)
    end = parse_time(event["broker_time"]) + timedelta(milliseconds=1)
    start = end - timedelta(milliseconds=span_ms + 1)
    with tempfile.TemporaryDirectory(prefix="rulectl-replay-") as tmp:
        rules_dir = Path(tmp) / "rules"
        rules_dir.mkdir()
        (rules_dir / "rule.json").write_text(json.dumps(rule), encoding="utf-8")
        out = Path(tmp) / "out"
        cfg = BacktestConfig(rules_dir, [], out, time_field, only=[parsed.rule_id],
                             history=HistoryWindow(str(Path(table).resolve()), start, end))
        run_backtest(spark, cfg)  # type: ignore[arg-type]
        ids = [json.loads(line).get("detection_id") for line in (out / "detections.jsonl").read_text().splitlines() if line]
    facts = {"from": _iso(int(start.timestamp() * 1000)), "to": _iso(int(end.timestamp() * 1000)),
             "detections": len(ids), "same_id": detection_id in ids}
    return Link("replay", detection_id in ids, facts,
                "the backtest of this rule version over the archive gives the same detection id" if detection_id in ids
                else "the backtest over the archive did not make this detection")


# --------------------------------------------------------------------------- all of it


@dataclass
class Sources:
    bootstrap: str
    audit: list[dict]
    sink_topic: str = "events.processed"
    shadow_topic: str = "events.shadow"
    rules_topic: str = "rules.active"
    archive_table: str | None = None
    repo: Path | None = None
    time_field: str = "timestamp"
    timeout: float = 60.0

    @classmethod
    def from_settings(cls, settings: object, **overrides: object) -> Sources:
        """The sources a platform's lifecycle settings name (`LifecycleSettings`)."""
        from spark_jobs.lifecycle.audit import read_records

        audit_dir = overrides.pop("audit_dir", None) or settings.audit_dir  # type: ignore[attr-defined]
        given = {k: v for k, v in overrides.items() if v is not None}
        return cls(**{
            "bootstrap": settings.bootstrap, "audit": read_records(audit_dir),  # type: ignore[attr-defined]
            "sink_topic": settings.sink_topic, "rules_topic": settings.rules_topic,  # type: ignore[attr-defined]
            "shadow_topic": settings.shadow_topic,  # type: ignore[attr-defined]
            "archive_table": settings.archive_table, "time_field": settings.time_field,  # type: ignore[attr-defined]
            **given,
        })


def recent_detections(bootstrap: str, sink_topic: str, last: int = 50, timeout: float = 30.0) -> list[dict]:
    """The newest `last` detections of each sink partition, newest first: what the UI
    lists to pick one from."""
    from spark_jobs.kafka.admin import assign_consumer, read_all_with

    consumer = assign_consumer(bootstrap, {"enable.partition.eof": True}, READER)
    try:
        records = read_all_with(consumer, sink_topic, timeout=timeout, last=last)
    finally:
        consumer.close()
    out = []
    for rec in sorted(records, key=lambda r: r.timestamp_ms, reverse=True)[:last]:
        doc = _doc(rec)
        if doc and isinstance(doc.get("detection_id"), str):
            out.append({"detection_id": doc["detection_id"], "rule_id": doc.get("rule_id"),
                        "rule_version": doc.get("rule_version"), "processed": doc.get("processed"), **_where(rec)})
    return out


def explain(detection_id: str, src: Sources, *, spark: object | None = None, replay: bool = False) -> Chain:
    """The chain of `detection_id`; `spark` (a session) for the event and the replay."""
    chain = Chain(detection_id)
    found = None
    for topic in (src.sink_topic, src.shadow_topic):  # a shadow version's detections are on the shadow topic
        found = find_detection(read_all(src.bootstrap, topic, timeout=src.timeout, role=READER), detection_id)
        if found is not None:
            break
    if found is None:
        chain.links.append(Link("detection", False, {"topics": [src.sink_topic, src.shadow_topic]},
                                f"no detection {detection_id} on {src.sink_topic} or {src.shadow_topic}"))
        return chain
    chain.links.append(detection_link(found))
    rule_id, version = found.doc["rule_id"], str(found.doc["rule_version"])
    mode = "shadow" if found.doc.get("mode") == "shadow" else "active"
    released = release_record(src.audit, rule_id, version, mode)
    if released is None:
        chain.links.append(Link("release", False, {"rule_id": rule_id, "version": version, "mode": mode},
                                f"the release audit has no published record of {rule_id} v{version} ({mode})"))
        return chain
    release, entry = released
    rules_records = read_all(src.bootstrap, src.rules_topic, timeout=src.timeout, role=READER)
    rule_link, rule = rule_text_link(rules_records, src.rules_topic, release, entry)
    event: dict | None = None
    if spark is not None:
        ev_link, event = event_link(spark, src.archive_table, found, rule)
    else:
        ev_link = Link("event", None, {}, "not looked up (no Spark session)")
    repo = src.repo or (Path(release["repo"]) if release.get("repo") and Path(release["repo"]).is_dir() else None)
    chain.links += [ev_link, rule_link, commit_link(repo, release, entry, rule), report_link(release),
                    approval_link(release), publish_link(release, rule_link), first_link(found)]
    if replay:
        chain.links.append(replay_link(spark, src.archive_table, rule, event, detection_id, time_field=src.time_field)
                           if spark is not None else Link("replay", None, {}, "no Spark session"))
    return chain
