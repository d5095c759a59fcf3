"""`rulectl backtest`: run rules over recorded topics on Spark."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from spark_jobs.backtest.inputs import InputError, InputSpec
from spark_jobs.backtest.runner import (
    BacktestConfig,
    BacktestError,
    HistoryWindow,
    load_rule_set,
    run_backtest,
)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rules", type=Path, required=True, help="rule directory (or file)")
    p.add_argument("--input", action="append", metavar="TOPIC=PATH",
                   help="a recorded topic: JSON Lines file or Parquet directory (repeatable)")
    p.add_argument("--history", metavar="TABLE",
                   help="read the event archive (Delta table path) instead of --input files")
    p.add_argument("--from", dest="start", default="-1h", metavar="T",
                   help="with --history: window start, ISO-8601 or relative (-1h, -30m, -2d); default -1h")
    p.add_argument("--to", dest="end", default="now", metavar="T",
                   help="with --history: window end (exclusive), ISO-8601, relative or now; default now")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    p.add_argument("--time-field", default="timestamp",
                   help="event field used as processing time for processing_time rules (default: timestamp)")
    p.add_argument("--sink-topic", default="events.processed")
    p.add_argument("--master", default=None, help="Spark master (default local[2])")
    p.add_argument("--remote", default=None, metavar="sc://HOST:PORT",
                   help="run on a Spark Connect server (`rulectl connect`; default: $SPARK_REMOTE, else a local session)")
    p.add_argument("--only", action="append", metavar="RULE_ID", help="backtest only these rules (repeatable)")


def join_relative_times(argv: list[str]) -> list[str]:
    """`--from -1h` -> `--from=-1h`: argparse reads a value starting with `-` that is not
    a plain number as an option, so the relative times would need `=`."""
    out: list[str] = []
    i = 0
    while i < len(argv):
        if argv[i] in ("--from", "--to") and i + 1 < len(argv) and argv[i + 1].startswith("-"):
            out.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            out.append(argv[i])
            i += 1
    return out


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("backtest", help="backtest rules over recorded topics on Spark")
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        if bool(args.input) == bool(args.history):
            raise InputError("give either --input TOPIC=PATH (repeatable) or --history TABLE")
        history = _history(args) if args.history else None
        inputs = [InputSpec.parse(s) for s in args.input or []]
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
    import os

    from spark_jobs.spark import REMOTE_ENV, remote_session, session

    remote = args.remote or os.environ.get(REMOTE_ENV)
    spark = remote_session(remote) if remote else session("rulectl-backtest", master=args.master)
    cfg = BacktestConfig(args.rules, inputs, args.out, args.time_field, args.sink_topic, args.only, history)
    try:
        summary = run_backtest(spark, cfg)
    except BacktestError as exc:
        print(f"rulectl backtest: {exc}", file=sys.stderr)
        return 1
    finally:
        if remote:
            spark.stop()  # this client's session on the server (not the server); a task runs it in-process
    print(json.dumps({k: summary[k] for k in ("detections", "dead_letter", "duration_s")}))
    print(f"wrote {args.out}/detections.jsonl, summary.json, dead_letter.jsonl")
    return 0


def _history(args: argparse.Namespace) -> HistoryWindow:
    from spark_jobs.archive.table import parse_time

    try:
        start, end = parse_time(args.start), parse_time(args.end)
    except ValueError as exc:
        raise InputError(f"--from/--to: {exc}") from exc
    if not start < end:
        raise InputError(f"--from ({start.isoformat()}) must be before --to ({end.isoformat()})")
    if not (Path(args.history) / "_delta_log").is_dir():
        raise InputError(f"--history {args.history}: not a Delta table (no _delta_log)")
    return HistoryWindow(str(Path(args.history).resolve()), start, end)
