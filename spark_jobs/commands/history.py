"""`rulectl history RULE_ID`: every release decision about a rule (who approved which
version, when, from which commit), read from the release audit log.

The audit dir defaults to the lifecycle settings (RULE_LIFECYCLE_AUDIT_DIR, or
RULE_LIFECYCLE_STATE_DIR/audit, or $AIRFLOW_HOME/rule_lifecycle/audit), then to where
`rulectl up` keeps it when run from this folder (var/airflow/rule_lifecycle/audit), so
the command needs no arguments beyond the rule id on an Airflow machine or next to
`rulectl up`. Invalid attempts (validation failed) are listed too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "history",
        help="who approved and published which version of a rule",
        description=__doc__.splitlines()[0],
    )
    p.add_argument("rule_id", metavar="RULE_ID")
    p.add_argument("--audit-dir", type=Path, default=None, help="directory of releases.jsonl (default: from settings)")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.add_argument("--version", dest="only_version", default=None, help="only this rule version")
    p.set_defaults(func=run)


UP_AUDIT_DIR = Path("var") / "airflow" / "rule_lifecycle" / "audit"


def _audit_dirs(arg: Path | None) -> list[Path]:
    """Where to look: --audit-dir; else the settings (RULE_LIFECYCLE_AUDIT_DIR,
    RULE_LIFECYCLE_STATE_DIR, AIRFLOW_HOME); else what `rulectl up` uses from this
    folder (`var/airflow/rule_lifecycle/audit`, its default workdir)."""
    if arg is not None:
        return [arg]
    from spark_jobs.lifecycle.settings import resolve_settings

    return [Path(resolve_settings(use_airflow=False).audit_dir), UP_AUDIT_DIR]


def run(args: argparse.Namespace) -> int:
    from spark_jobs.lifecycle.audit import audit_path, read_records, rule_history

    candidates = _audit_dirs(args.audit_dir)
    audit_dir = next((d for d in candidates if audit_path(d).exists()), None)
    if audit_dir is None:
        tried = ", ".join(str(audit_path(d)) for d in candidates)
        print(
            f"rulectl history: no audit log (looked at {tried}); give --audit-dir, or run it where "
            "`rulectl up` ran (its workdir var/), or set RULE_LIFECYCLE_STATE_DIR",
            file=sys.stderr,
        )
        return 2
    rows = rule_history(read_records(audit_dir), args.rule_id)
    if args.only_version is not None:
        rows = [r for r in rows if str(r["version"]) == str(args.only_version)]
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0 if rows else 1
    if not rows:
        print(f"No release decision about {args.rule_id!r} in {audit_path(audit_dir)}")
        return 1
    for r in rows:
        if r["event"] == "invalid":
            print(_invalid_line(r))
            continue
        prev = f" (was {r['previous_version']})" if r.get("previous_version") else " (new rule)"
        what = {
            "published": "published" if r.get("produced") else "approved (already live)",
            "rejected": "REJECTED",
            "invalid": "invalid",
            "no_change": "unchanged",
        }.get(r["event"], r["event"])
        by = f" by {r['by']}" if r.get("by") else ""
        if r.get("mode") == "shadow":
            what += " as a shadow"
        line = f"{r.get('at') or '?'}  version {r['version']}{prev}  {what}{by}  commit {str(r.get('commit'))[:12]}"
        if r.get("comment") or r.get("reason"):
            line += f"  — {r.get('comment') or r.get('reason')}"
        if r.get("run_id"):
            line += f"  [{r.get('dag_id')} {r['run_id']}]"
        if r.get("report_sha256"):
            line += f"  report sha256 {r['report_sha256'][:16]}"
        print(line)
    return 0


def _invalid_line(r: dict) -> str:
    """An invalid commit: it released no version, so the line says why it was refused
    (file, field, reason of each error about the rule) instead of a version."""
    errors = r.get("errors") or []
    why = "; ".join(f"{e.get('file')}: field '{e.get('field')}': {e.get('reason')}" for e in errors)
    line = (f"{r.get('at') or '?'}  INVALID commit {str(r.get('commit'))[:12]} (validation failed, nothing published): "
            f"{why or r.get('reason') or 'no reason recorded'}")
    if r.get("run_id"):
        line += f"  [{r.get('dag_id')} {r['run_id']}]"
    return line
