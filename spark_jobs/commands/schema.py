"""`rulectl schema`: (re)generate the checked-in JSON Schema of the rule language."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from spark_jobs.rules.model import rule_json_schema

DEFAULT_PATH = Path("rules/schema/rule.schema.json")


def render() -> str:
    return json.dumps(rule_json_schema(), indent=2, sort_keys=True) + "\n"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("schema", help="write the rule JSON Schema (default rules/schema/rule.schema.json)")
    p.add_argument("--out", type=Path, default=DEFAULT_PATH, help="'-' prints to stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    text = render()
    if str(args.out) == "-":
        print(text, end="")
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0
