"""The release audit log: who approved what, when, from which commit.

One JSON object per line in `<audit_dir>/releases.jsonl`, appended (never rewritten)
by the release DAG at the end of every run that reached a decision:

- `published`: approved and produced to `rules.active` (approver, time, comment,
  commit, and every rule version of the release with whether it was actually produced
  and, when it was, the record's partition and offset,
  the SHA-256 of the report the approver was shown, the e-mails of the release's
  authors, none of whom could approve it);
- `rejected`: the approver said no (who, when, why); nothing was produced;
- `invalid`: validation failed (the errors); nothing was produced;
- `no_change`: the commit holds exactly the live rules; nothing to do;
- `detected`: a run took a commit to release (not a decision: the run is pending until
  one of the above, or `superseded`, names its run);
- `failed`: the run failed (an error, an approval that timed out); nothing was produced;
- `superseded`: a newer commit of the branch started its own release while this run
  waited; this run publishes nothing (its approval is ended, `superseded_by` says by
  which run and commit).

The newest `published` record is the base of the next release (`--base` of the
validation), and every decided commit counts as processed so the poller does not start
a second run for it. The approver comes from Airflow's own human-in-the-loop record
(the response the UI or REST API stored), so this log and Airflow agree. Plain JSON
Lines keep `rulectl history` independent of Airflow.
"""

from __future__ import annotations

import fcntl
import json
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from pathlib import Path

AUDIT_FILE = "releases.jsonl"
DECIDED_EVENTS = frozenset({"published", "rejected", "invalid", "no_change"})
CLOSED_EVENTS = DECIDED_EVENTS | {"superseded", "failed"}


def now_iso() -> str:
    return datetime.now(tz=UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def audit_path(audit_dir: Path | str) -> Path:
    return Path(audit_dir) / AUDIT_FILE


def append_record(audit_dir: Path | str, record: dict) -> dict:
    """Append one record (adds `recorded_at`); safe against concurrent writers."""
    path = audit_path(audit_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    rec = {"recorded_at": now_iso(), **record}
    line = json.dumps(rec, sort_keys=True, default=str) + "\n"
    with path.open("a", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            fh.write(line)
            fh.flush()
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
    return rec


def append_unless(audit_dir: Path | str, record: dict, conflict: Callable[[list[dict]], dict | None]) -> dict | None:
    """Append `record` unless `conflict(records)` returns an existing record, which is
    then returned instead (None: appended). The read and the append hold one lock, so
    two runs that check at the same moment cannot both pass (two release runs polling
    the same new commit: one claims it, the other stands down)."""
    path = audit_path(audit_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            fh.seek(0)
            found = conflict(_parse(fh.read()))
            if found is not None:
                return found
            fh.write(json.dumps({"recorded_at": now_iso(), **record}, sort_keys=True, default=str) + "\n")
            fh.flush()
            return None
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def read_records(audit_dir: Path | str) -> list[dict]:
    """All records, oldest first; a torn last line (crash mid-write) is ignored."""
    path = audit_path(audit_dir)
    if not path.exists():
        return []
    return _parse(path.read_text(encoding="utf-8"))


def _parse(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict):
            out.append(rec)
    return out


def last_published_commit(audit_dir: Path | str, repo: str | None = None, branch: str | None = None) -> str | None:
    """Commit of the newest `published` record (for this repo/branch when given)."""
    for rec in reversed(read_records(audit_dir)):
        if rec.get("event") != "published":
            continue
        if repo is not None and rec.get("repo") not in (None, repo):
            continue
        if branch is not None and rec.get("branch") not in (None, branch):
            continue
        return rec.get("commit")
    return None


def processed_commits(audit_dir: Path | str) -> set[str]:
    return {r["commit"] for r in read_records(audit_dir) if r.get("event") in DECIDED_EVENTS and r.get("commit")}


def pending_runs(audit_dir: Path | str, repo: str | None = None, branch: str | None = None) -> list[dict]:
    """`detected` records of runs that have not reached a decision nor been superseded."""
    return pending_in(read_records(audit_dir), repo, branch)


def pending_in(records: list[dict], repo: str | None = None, branch: str | None = None) -> list[dict]:
    """`pending_runs` of records already read (inside `append_unless`'s lock)."""
    closed = {r.get("run_id") for r in records if r.get("event") in CLOSED_EVENTS}
    out: dict[str, dict] = {}
    for rec in records:
        if rec.get("event") != "detected" or rec.get("run_id") in closed:
            continue
        if repo is not None and rec.get("repo") not in (None, repo):
            continue
        if branch is not None and rec.get("branch") not in (None, branch):
            continue
        out[rec["run_id"]] = rec
    return list(out.values())


def superseded_by(audit_dir: Path | str, run_id: str) -> dict | None:
    """The `superseded` record of a run, if a newer release superseded it."""
    for rec in read_records(audit_dir):
        if rec.get("event") == "superseded" and rec.get("run_id") == run_id:
            return rec
    return None


def rule_history(records: Iterable[dict], rule_id: str) -> list[dict]:
    """One row per audit record that names `rule_id`, oldest first."""
    rows = []
    for rec in records:
        named = list(rec.get("rules") or [])
        errors: list[dict] = []
        if rec.get("event") == "invalid" and not named:
            # A rejected-by-validation attempt names the rule in its errors only; the
            # row keeps those errors (file, field, reason): they are what happened.
            errors = [
                {k: e.get(k) for k in ("file", "field", "reason")}
                for e in rec.get("errors") or []
                if e.get("rule_id") == rule_id or (not e.get("rule_id") and rule_id in str(e.get("file") or ""))
            ]
            if errors:
                named.append({"rule_id": rule_id, "version": None, "file": errors[0]["file"]})
        for r in named:
            if r.get("rule_id") != rule_id:
                continue
            approver = rec.get("approved_by") or rec.get("decided_by") or {}
            rows.append(
                {
                    "event": rec.get("event"),
                    "rule_id": rule_id,
                    "version": r.get("version"),
                    "mode": r.get("mode", "active"),
                    "previous_version": r.get("previous_version"),
                    "produced": r.get("produced"),
                    "commit": rec.get("commit"),
                    "by": approver.get("name") or approver.get("id"),
                    "by_id": approver.get("id"),
                    "at": rec.get("decided_at") or rec.get("recorded_at"),
                    "comment": rec.get("comment"),
                    "dag_id": rec.get("dag_id"),
                    "run_id": rec.get("run_id"),
                    "report": rec.get("report"),
                    "report_sha256": (rec.get("report_sha256") or {}).get("report.html"),
                    "authors": rec.get("authors") or [],
                    "reason": rec.get("reason"),
                    "errors": errors,
                }
            )
    return rows
