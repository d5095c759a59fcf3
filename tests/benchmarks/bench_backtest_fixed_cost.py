"""A backtest's fixed cost: a cold `rulectl backtest` on a small input, split into
Python imports, Spark start-up (JVM, session, jars) and the backtest's own work, and
the same backtest again on the warm session (what a kept-warm Spark would give a PR
check). Also the same events from the event archive (Delta) instead of a file.

    python tests/benchmarks/bench_backtest_fixed_cost.py [--events 1000] [--rules rules]

Run each measurement in a fresh process (the default does): Spark start-up happens once
per process. Under load (other jobs on the machine) the figures are upper bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import append_result  # noqa: E402


def _child(events: int, rules: Path, work: Path) -> dict:
    t0 = time.perf_counter()
    from spark_jobs.backtest.inputs import InputSpec
    from spark_jobs.backtest.runner import BacktestConfig, HistoryWindow, run_backtest
    from spark_jobs.spark import session

    t_import = time.perf_counter() - t0
    demo = (ROOT / "tests" / "data" / "demo" / "events.raw.jsonl").read_text().splitlines()
    lines = [demo[i % len(demo)] for i in range(events)]
    src = work / "events.jsonl"
    src.write_text("\n".join(lines) + "\n")
    ctx = work / "context.jsonl"
    ctx.write_text((ROOT / "tests" / "data" / "demo" / "context.raw.jsonl").read_text())
    t1 = time.perf_counter()
    spark = session("bench-fixed-cost")
    spark.range(1).count()  # the JVM and the executor are up
    t_spark = time.perf_counter() - t1
    inputs = [InputSpec("events.raw", str(src)), InputSpec("context.raw", str(ctx))]
    runs = []
    for i in range(3):
        t2 = time.perf_counter()
        run_backtest(spark, BacktestConfig(rules, inputs, work / f"out{i}"))
        runs.append(time.perf_counter() - t2)
    # The same records from a Delta archive table.
    from datetime import UTC, datetime, timedelta

    from pyspark.sql import functions as F

    from spark_jobs.archive.table import PARTITION_COLUMNS, archive_columns

    now = datetime.now(UTC)
    raw = spark.read.text(str(src)).select(F.col("value").cast("binary").alias("value")).union(
        spark.read.text(str(ctx)).select(F.col("value").cast("binary").alias("value")))
    df = spark.createDataFrame([(0,)], "x int").crossJoin(raw.withColumn("i", F.monotonically_increasing_id()))
    n_ev = len(lines)
    df = df.select(F.when(F.col("i") < n_ev, "events.raw").otherwise("context.raw").alias("topic"),
                   F.lit(0).alias("partition"), F.col("i").alias("offset"),
                   F.lit(now - timedelta(minutes=5)).alias("timestamp"), F.lit(None).cast("binary").alias("key"),
                   "value")
    table = str(work / "archive")
    archive_columns(df, "timestamp").write.format("delta").partitionBy(*PARTITION_COLUMNS).save(table)
    archive_runs = []
    for i in range(2):
        t3 = time.perf_counter()
        run_backtest(spark, BacktestConfig(rules, [], work / f"aout{i}",
                                           history=HistoryWindow(table, now - timedelta(hours=1), now)))
        archive_runs.append(time.perf_counter() - t3)
    spark.stop()
    return {"events": events, "imports_s": round(t_import, 2), "spark_startup_s": round(t_spark, 2),
            "backtest_cold_s": round(runs[0], 2), "backtest_warm_s": [round(r, 2) for r in runs[1:]],
            "archive_backtest_s": [round(r, 2) for r in archive_runs],
            "total_cold_s": round(t_import + t_spark + runs[0], 2)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--events", type=int, default=1000)
    p.add_argument("--rules", type=Path, default=ROOT / "rules")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        with tempfile.TemporaryDirectory() as d:
            print(json.dumps(_child(args.events, args.rules, Path(d))))
        return
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, __file__, "--child", "--events", str(args.events), "--rules",
                          str(args.rules)], capture_output=True, text=True, env={**os.environ})
    wall = time.perf_counter() - t0
    if out.returncode != 0:
        sys.exit(out.stderr[-3000:])
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["process_wall_s"] = round(wall, 2)
    print(json.dumps(result, indent=2))
    events = result.pop("events")
    append_result("backtest_fixed_cost", result, events=events, rules=str(args.rules))


if __name__ == "__main__":
    main()
