"""Backtest throughput: 1M events, 50 threshold + 10 velocity + 2 correlation rules.

    python tests/benchmarks/bench_backtest.py [--events 1000000] [--keep DIR] [--table] [--rule-copies N] [--loop]

Generates the events (JSON Lines) and rules in a temp dir, runs the backtest on a local
Spark session (local[2]) and prints events/s. The Spark session is started before the
clock starts; input reading and JSON parsing are inside the timed region.

`--table`: the same records are first written (untimed) to a Delta table shaped like the
event archive (spark_jobs.archive.table: parsed once, partitioned by topic and date,
one Kafka partition per topic with the file's line order as offsets), and the timed
backtest reads a window of that table instead of the files (`rulectl backtest
--history`); each --repeat run's window ends a millisecond later, as a window of the
last hour moves between backtests.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import random
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import append_result  # noqa: E402

# The rule set, shared with bench_backtest_floor.py, which spells the same rules out.
EVENT_TYPES = ["purchase", "click", "view", "transfer"]
VELOCITY_AGGS = ["count", "sum", "avg", "min", "max", "distinct_count", "count", "sum", "count", "max"]
VELOCITY_THRESHOLDS = {"count": 8, "sum": 4000, "avg": 800, "min": 5, "max": 990, "distinct_count": 4}
GLOBAL_VELOCITY = 6  # vel_6 has no group_by
GLOBAL_THRESHOLD = 400


def threshold_rule(i: int) -> tuple[str, int]:
    """th_{i}: (the event type it matches, its minimum amount)."""
    return EVENT_TYPES[i % 4], 900 + i * 2


def velocity_window_s(i: int, scale: float = 1.0) -> int:
    return max(1, round((30 + i * 10) * scale))


def make_rules(directory: Path, copies: int = 0, window_scale: float = 1.0) -> None:
    """The 62 rules, and `copies` more: copies of the threshold and velocity rules in turn,
    each also asking for one user (`user_id == "u<k>"`: about one event in 20,000), so a
    larger rule set finds about the same detections (the rule sets of the field: many
    rules, most of them matching few events). `window_scale` scales the velocity windows
    (what a window's size costs)."""
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
            "group_by": "user_id", "window_size": velocity_window_s(i, window_scale), "window_unit": "seconds",
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
    plain = [r for r in rules if r["rule_type"] != "correlation"]
    for k in range(copies):
        r = json.loads(json.dumps(plain[k % len(plain)]))
        r["rule_id"] = f"{r['rule_id']}_u{k}"
        r["conditions"] = [*r["conditions"], {"field": "user_id", "operator": "==", "value": f"u{k % 20000}"}]
        rules.append(r)
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


def prepare(keep: Path | None, events: int, prefix: str, copies: int = 0) -> tuple[Path, Path, Path]:
    """The work folder (`keep`, or a new temp dir) with the rules and, unless already
    there, the events: (folder, events file, context file). Shared with the other
    benchmarks (--keep DIR), so they measure the same files."""
    work = keep or Path(tempfile.mkdtemp(prefix=prefix))
    (work / "rules").mkdir(parents=True, exist_ok=True)
    make_rules(work / "rules", copies)
    ev, ctx = work / "events.jsonl", work / "context.jsonl"
    if not ev.exists():
        t = time.time()
        make_events(ev, ctx, events)
        print(f"generated {events} events in {time.time() - t:.1f}s ({ev.stat().st_size / 1e6:.0f} MB)")
    return work, ev, ctx


def jvm_cpu_s(spark) -> float:
    """CPU seconds the local Spark JVM has used: less sensitive than wall time to other
    load on the machine, so two runs can be compared when it is not idle."""
    pid = spark.sparkContext._jvm.ProcessHandle.current().pid()
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def jit_s(spark) -> float:
    """Seconds HotSpot's JIT compilers have spent compiling in this JVM: on two cores,
    what a "warm" run still pays while the JIT has not settled, which can be a large
    share of a run for many runs (docs/benchmarks.md)."""
    return spark.sparkContext._jvm.java.lang.management.ManagementFactory.getCompilationMXBean() \
        .getTotalCompilationTime() / 1000


def archive_table(spark, work: Path, ev: Path, ctx: Path):
    """The files as an archive table (written once, reused while `--keep DIR` is kept):
    what `rulectl archive` would have written had the events come through Kafka."""
    from datetime import UTC, datetime, timedelta

    from pyspark.sql import functions as F

    from spark_jobs.archive.table import PARTITION_COLUMNS, archive_columns, exists
    from spark_jobs.backtest.runner import HistoryWindow

    table = str(work / "archive")
    stamp = work / "archive.at"
    if not (exists(spark, table) and stamp.exists()):
        at = datetime.now(UTC) - timedelta(minutes=5)
        parts = []
        for topic, path in (("events.raw", ev), ("context.raw", ctx)):
            lines = spark.read.text(str(path)).select(F.col("value").cast("binary").alias("value"))
            # zipWithIndex keeps the file's order as the offsets (one Kafka partition).
            indexed = lines.rdd.zipWithIndex().toDF(["r", "offset"])
            parts.append(indexed.select(
                F.lit(topic).alias("topic"), F.lit(0).alias("partition"), F.col("offset"),
                F.timestamp_millis(F.lit(int(at.timestamp() * 1000))).alias("timestamp"),
                F.lit(None).cast("binary").alias("key"), F.col("r.value").alias("value")))
        t = time.time()
        archive_columns(parts[0].unionByName(parts[1]), "ts").write.format("delta").mode("overwrite") \
            .partitionBy(*PARTITION_COLUMNS).save(table)
        stamp.write_text(at.isoformat())
        print(f"archive table written in {time.time() - t:.1f}s (untimed)")
    at = datetime.fromisoformat(stamp.read_text())
    return HistoryWindow(table, at - timedelta(hours=1), at + timedelta(minutes=1))


def loop_figures(work: Path, ev: Path, ctx: Path, summary: dict, elapsed: float) -> dict:
    """The plain-Python baseline on the same files, after the backtest (not beside it)."""
    from python_loop import run as run_loop

    loop_s, found = run_loop(work / "rules", [("events.raw", ev), ("context.raw", ctx)])
    equal = all(found.get(rid, 0) == r["detections"] for rid, r in summary["rules"].items())
    print(f"python loop: {loop_s:.1f}s, detections {'EQUAL to' if equal else 'DIFFERENT from'} the backtest's "
          f"per rule; backtest {loop_s / elapsed:.2f}x the loop")
    return {"loop_s": round(loop_s, 1), "loop_ratio": round(loop_s / elapsed, 2), "loop_equal": equal}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keep", type=Path)
    ap.add_argument("--only", action="append", help="time only these rule ids (repeatable), e.g. th_01")
    ap.add_argument("--conf", action="append", default=[], help="extra Spark setting KEY=VALUE (repeatable)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the backtest this many times in the one session (later runs: a warm JVM, "
                         "as on a running Spark Connect server)")
    ap.add_argument("--table", action="store_true", help="backtest from a Delta archive table of the same records")
    ap.add_argument("--rule-copies", type=int, default=0,
                    help="more rules: copies of the threshold and velocity rules, each asking for one user")
    ap.add_argument("--loop", action="store_true",
                    help="then the same rules over the same files in one plain Python process (python_loop.py): "
                         "its time, the ratio, and whether its detections per rule equal the backtest's")
    args = ap.parse_args()
    from spark_jobs.backtest.inputs import InputSpec
    from spark_jobs.backtest.runner import BacktestConfig, run_backtest
    from spark_jobs.spark import session

    work, ev, ctx = prepare(args.keep, args.events, "bench-backtest-", args.rule_copies)
    extra = dict(c.split("=", 1) for c in args.conf)
    spark = session("bench-backtest", master="local[2]", shuffle_partitions=4, extra=extra)
    spark.range(10).count()  # JVM warm-up outside the timed region
    if args.table:
        history = archive_table(spark, work, ev, ctx)
        cfg = BacktestConfig(work / "rules", [], work / "out", only=args.only, history=history)
    else:
        cfg = BacktestConfig(work / "rules", [InputSpec("events.raw", str(ev)), InputSpec("context.raw", str(ctx))],
                             work / "out", only=args.only)
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}, local[2]")
    source = "the archive table" if args.table else "JSON Lines"
    for run in range(args.repeat):
        if args.table:
            # Each run's window ends a millisecond later (the same records), as the last
            # hour (`--from -1h`, the DAGs' default) moves from one backtest to the next.
            cfg.history = dataclasses.replace(history, end=history.end + timedelta(milliseconds=run))
        t, cpu, jit, py = time.time(), jvm_cpu_s(spark), jit_s(spark), time.process_time()
        summary = run_backtest(spark, cfg)
        elapsed, cpu, jit = time.time() - t, jvm_cpu_s(spark) - cpu, jit_s(spark) - jit
        py = time.process_time() - py
        print(f"rules: 50 threshold + 10 velocity + 2 correlation + {args.rule_copies} copies; "
              f"detections: {summary['detections']}")
        # busy: the CPU the JVM and this (driver) process used, as a share of both cores
        # over the run: near 100%, a run is CPU-bound and only less work makes it faster.
        print(f"run {run + 1}: backtest of {args.events} events from {source}: {elapsed:.1f}s -> "
              f"{args.events / elapsed:,.0f} events/s (Spark JVM CPU {cpu:.1f}s, of it JIT compiling "
              f"{jit:.1f}s; driver Python {py:.1f}s; busy {(cpu + py) / (2 * elapsed):.0%} of 2 cores)")
        figures = {
            "elapsed_s": round(elapsed, 1), "events_per_s": round(args.events / elapsed),
            "jvm_cpu_s": round(cpu, 1), "jit_s": round(jit, 1), "driver_cpu_s": round(py, 1),
            "detections": summary["detections"],
        }
        if args.loop and run == 0 and not args.table and not args.only:
            figures.update(loop_figures(work, ev, ctx, summary, elapsed))
        append_result("backtest", figures, events=args.events, rules=62 + args.rule_copies, source="table" if args.table else "json", run=run + 1,
            only=args.only,
            conf=args.conf or None)


if __name__ == "__main__":
    main()
