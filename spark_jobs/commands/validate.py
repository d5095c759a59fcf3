"""`rulectl validate`: what a rules pull request runs."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from spark_jobs.rules.validation import validate_paths
from spark_jobs.rules.versioning import GitError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("validate", help="validate rule files (exit 0 valid, 1 invalid, 2 usage error)")
    p.add_argument("paths", nargs="*", default=["rules"], metavar="PATH", help="rule files or directories (default: rules/)")
    p.add_argument("--base", metavar="GITREF", help="check only files changed since GITREF, plus cross-rule and version-bump checks")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(func=run)


def _scope(report, base: str | None) -> str:  # type: ignore[no-untyped-def]
    """With --base, what was checked: "N valid rule(s)" counts every rule (the
    cross-rule checks need them all), so say separately which files changed."""
    if not base:
        return ""
    files = report.checked_files
    changed = f"; {len(files)} file(s) changed since {base}"
    if files:
        changed += f": {', '.join(files)}"
    if report.changed_rule_ids:
        changed += f" (rule(s) {', '.join(report.changed_rule_ids)})"
    return changed


def run(args: argparse.Namespace) -> int:
    paths = [Path(p) for p in args.paths]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        print(f"rulectl validate: no such file or directory: {', '.join(missing)}", file=sys.stderr)
        return 2
    try:
        report = validate_paths(paths, base=args.base)
    except GitError as exc:
        print(f"rulectl validate: {exc}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(report.to_dict(), indent=2))
    else:
        for err in report.errors:
            print(f"ERROR {err}")
        n = len(report.rules)
        status = "OK" if report.ok else f"FAILED ({len(report.errors)} error(s))"
        print(f"{status}: {n} valid rule(s){_scope(report, args.base)}")
    return 0 if report.ok else 1
