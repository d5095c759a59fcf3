"""`rulectl backtest`: run rules over recorded topics on Spark."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from spark_jobs.backtest.inputs import InputError, InputSpec
from spark_jobs.backtest.runner import BacktestConfig, BacktestError, load_rule_set, run_backtest


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rules", type=Path, required=True, help="rule directory (or file)")
    p.add_argument("--input", action="append", required=True, metavar="TOPIC=PATH",
                   help="a recorded topic: JSON Lines file or Parquet directory (repeatable)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--time-field", default="timestamp",
                   help="event field used as processing time for processing_time rules (default: timestamp)")
    p.add_argument("--sink-topic", default="events.processed")
    p.add_argument("--master", default=None, help="Spark master (default local[2])")
    p.add_argument("--only", action="append", metavar="RULE_ID", help="backtest only these rules (repeatable)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("backtest", help="backtest rules over recorded topics on Spark")
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        inputs = [InputSpec.parse(s) for s in args.input]
        for spec in inputs:
            if not Path(spec.path).exists():
                raise InputError(f"input for topic {spec.topic!r}: no such file or directory: {spec.path}")
        load_rule_set(args.rules, args.only)  # fail fast, before Spark starts
    except InputError as exc:
        print(f"rulectl backtest: {exc}", file=sys.stderr)
        return 2
    except BacktestError as exc:
        print(f"rulectl backtest: {exc}", file=sys.stderr)
        for err in exc.errors:
            print(f"ERROR {err}", file=sys.stderr)
        return 1
    from spark_jobs.spark import session

    spark = session("rulectl-backtest", master=args.master)
    cfg = BacktestConfig(args.rules, inputs, args.out, args.time_field, args.sink_topic, args.only)
    try:
        summary = run_backtest(spark, cfg)
    except BacktestError as exc:
        print(f"rulectl backtest: {exc}", file=sys.stderr)
        return 1
    print(json.dumps({k: summary[k] for k in ("detections", "dead_letter", "duration_s")}))
    print(f"wrote {args.out}/detections.jsonl, summary.json, dead_letter.jsonl")
    return 0
