"""Backtest throughput: 1M events, 50 threshold + 10 velocity + 2 correlation rules.

    python tests/benchmarks/bench_backtest.py [--events 1000000] [--keep DIR]

Generates the events (JSON Lines) and rules in a temp dir, runs the backtest on a local
Spark session (local[2]) and prints events/s. The Spark session is started before the
clock starts; input reading and JSON parsing are inside the timed region.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path

import yaml

# The rule set, shared with bench_backtest_floor.py, which spells the same rules out.
EVENT_TYPES = ["purchase", "click", "view", "transfer"]
VELOCITY_AGGS = ["count", "sum", "avg", "min", "max", "distinct_count", "count", "sum", "count", "max"]
VELOCITY_THRESHOLDS = {"count": 8, "sum": 4000, "avg": 800, "min": 5, "max": 990, "distinct_count": 4}
GLOBAL_VELOCITY = 6  # vel_6 has no group_by
GLOBAL_THRESHOLD = 400


def threshold_rule(i: int) -> tuple[str, int]:
    """th_{i}: (the event type it matches, its minimum amount)."""
    return EVENT_TYPES[i % 4], 900 + i * 2


def velocity_window_s(i: int) -> int:
    return 30 + i * 10


def make_rules(directory: Path) -> None:
    rules = []
    for i in range(50):
        event_type, min_amount = threshold_rule(i)
        rules.append({
            "rule_id": f"th_{i:02d}", "version": "1", "rule_type": "threshold", "source_topic": "events.raw",
            "conditions": [
                {"field": "type", "operator": "==", "value": event_type},
                {"field": "amount", "operator": ">=", "value": min_amount},
            ],
        })
    for i, agg in enumerate(VELOCITY_AGGS):
        r = {
            "rule_id": f"vel_{i}", "version": "1", "rule_type": "velocity", "source_topic": "events.raw",
            "group_by": "user_id", "window_size": velocity_window_s(i), "window_unit": "seconds",
            "aggregation_type": agg, "threshold": VELOCITY_THRESHOLDS[agg],
            "time_mode": "event_time", "timestamp_field": "ts",
            "conditions": [{"field": "type", "operator": "!=", "value": "view"}],
        }
        if agg != "count":
            r["aggregation_field"] = "amount" if agg != "distinct_count" else "merchant"
        if i == GLOBAL_VELOCITY:
            r.pop("group_by")
            r["threshold"] = GLOBAL_THRESHOLD
        rules.append(r)
    rules.append({
        "rule_id": "corr_fx", "version": "1", "rule_type": "correlation", "source_topic": "events.raw",
        "context_topic": "context.raw", "correlation_key": "currency_pair", "window_size": 5, "window_unit": "minutes",
        "context_resolution": "last", "context_value_field": "rate", "event_value_field": "implied_rate",
        "timestamp_field": "ts", "metric": "ratio_deviation", "condition": {"operator": ">", "value": 0.02},
    })
    rules.append({
        "rule_id": "corr_z", "version": "1", "rule_type": "correlation", "source_topic": "events.raw",
        "context_topic": "context.raw", "correlation_key": "currency_pair", "window_size": 10, "window_unit": "minutes",
        "context_resolution": "mean_std", "context_value_field": "rate", "event_value_field": "implied_rate",
        "timestamp_field": "ts", "metric": "z_score", "condition": {"operator": ">", "value": 3}, "min_context_points": 3,
    })
    (directory / "bench.yaml").write_text(yaml.safe_dump([{k: v for k, v in r.items() if v is not None} for r in rules]))


def make_events(path: Path, ctx_path: Path, n: int, seed: int = 7) -> None:
    rnd = random.Random(seed)
    start = 1_767_225_600_000
    pairs = ["EURUSD", "GBPUSD", "USDJPY", "AUDUSD"]
    with path.open("w") as f:
        for i in range(n):
            ev = {
                "event_id": i, "type": EVENT_TYPES[rnd.randrange(4)], "user_id": f"u{rnd.randrange(20000)}",
                "amount": rnd.randrange(1000), "merchant": f"m{rnd.randrange(50)}", "ts": start + i * 3,
            }
            if i % 10 == 0:
                ev["currency_pair"] = pairs[rnd.randrange(4)]
                ev["implied_rate"] = round(1 + rnd.random() * 0.1, 4)
            f.write(json.dumps(ev, separators=(",", ":")) + "\n")
    with ctx_path.open("w") as f:
        for i in range(0, n * 3, 5000):
            for p in pairs:
                f.write(json.dumps({"currency_pair": p, "rate": round(1.02 + rnd.random() * 0.04, 4), "ts": start + i}) + "\n")


def jvm_cpu_s(spark) -> float:
    """CPU seconds the local Spark JVM has used: less sensitive than wall time to other
    load on the machine, so two runs can be compared when it is not idle."""
    pid = spark.sparkContext._jvm.ProcessHandle.current().pid()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keep", type=Path)
    ap.add_argument("--only", action="append", help="time only these rule ids (repeatable), e.g. th_01")
    ap.add_argument("--conf", action="append", default=[], help="extra Spark setting KEY=VALUE (repeatable)")
    args = ap.parse_args()
    from spark_jobs.backtest.inputs import InputSpec
    from spark_jobs.backtest.runner import BacktestConfig, run_backtest
    from spark_jobs.spark import session

    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-backtest-"))
    (work / "rules").mkdir(parents=True, exist_ok=True)
    make_rules(work / "rules")
    ev, ctx = work / "events.jsonl", work / "context.jsonl"
    if not ev.exists():
        t = time.time()
        make_events(ev, ctx, args.events)
        print(f"generated {args.events} events in {time.time() - t:.1f}s ({ev.stat().st_size / 1e6:.0f} MB)")
    extra = dict(c.split("=", 1) for c in args.conf)
    spark = session("bench-backtest", master="local[2]", shuffle_partitions=4, extra=extra)
    spark.range(10).count()  # JVM warm-up outside the timed region
    cfg = BacktestConfig(work / "rules", [InputSpec("events.raw", str(ev)), InputSpec("context.raw", str(ctx))], work / "out", only=args.only)
    t, cpu = time.time(), jvm_cpu_s(spark)
    summary = run_backtest(spark, cfg)
    elapsed, cpu = time.time() - t, jvm_cpu_s(spark) - cpu
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}, local[2]")
    print(f"rules: 50 threshold + 10 velocity + 2 correlation; detections: {summary['detections']}")
    print(f"backtest of {args.events} events: {elapsed:.1f}s -> {args.events / elapsed:,.0f} events/s "
          f"(Spark JVM CPU {cpu:.1f}s)")


if __name__ == "__main__":
    main()
