"""`rulectl publish`: validate a rule directory and publish what changed to `rules.active`.

Validation runs first and is all-or-nothing: one invalid rule and nothing is published,
because a half-published rule set is a state nobody reviewed. Publishing is idempotent
(see spark_jobs.kafka.publisher): rules already live with the same content are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from spark_jobs.kafka.publisher import RULES_TOPIC, PublishError, PublishResult, publish_rules
from spark_jobs.rules.loader import RuleError, load_rules


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("publish", help="validate rules and publish the changed ones to the rules topic")
    p.add_argument("--rules", required=True, metavar="DIR", help="rule directory (or file) to publish")
    p.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092"), help="Kafka bootstrap servers")
    p.add_argument("--topic", default=RULES_TOPIC, help=f"rules topic (default: {RULES_TOPIC})")
    p.add_argument("--published-by", default=os.environ.get("USER"), help="audit header: who publishes")
    p.add_argument("--commit", default=None, help="audit header: git commit of the rule set")
    p.add_argument("--timeout", type=float, default=30.0, help="broker timeout in seconds")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    path = Path(args.rules)
    if not path.exists():
        print(f"rulectl publish: no such file or directory: {path}", file=sys.stderr)
        return 2
    loaded = load_rules([path])
    if loaded.errors:
        _print_errors(loaded.errors, args.format)
        return 1
    if not loaded.rules:
        _print_errors([RuleError(str(path), "-", "no rule files found")], args.format)
        return 1
    try:
        result = publish_rules(
            [lr.rule for lr in loaded.rules],
            args.bootstrap,
            args.topic,
            published_by=args.published_by,
            commit=args.commit,
            timeout=args.timeout,
        )
    except (PublishError, RuntimeError, TimeoutError) as exc:
        print(f"rulectl publish: {exc}", file=sys.stderr)
        return 1
    _print_result(result, args.format)
    return 0


def _print_errors(errors: list[RuleError], fmt: str) -> None:
    if fmt == "json":
        print(json.dumps({"ok": False, "errors": [e.to_dict() for e in errors]}, indent=2))
        return
    for err in errors:
        print(f"ERROR {err}")
    print(f"FAILED ({len(errors)} error(s)): nothing published")


def _print_result(result: PublishResult, fmt: str) -> None:
    if fmt == "json":
        print(json.dumps({"ok": True, **result.to_dict()}, indent=2))
        return
    for ref in result.published:
        print(f"published {ref.rule_id} version {ref.version}")
    for ref in result.unchanged:
        print(f"unchanged {ref.rule_id} version {ref.version}")
    for ref in result.same_version:
        print(
            f"WARNING {ref.rule_id}: content changed but version is still {ref.version!r}; "
            "bump the version so the running job replaces the rule",
            file=sys.stderr,
        )
    print(f"OK: {len(result.published)} published, {len(result.unchanged)} unchanged on {result.topic}")
