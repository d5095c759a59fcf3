"""The floor under the backtest: what Spark needs on this machine for the work no
implementation of bench_backtest.py's run can skip.

    python tests/benchmarks/bench_backtest_floor.py [--events 1000000] [--keep DIR]

Same events as bench_backtest.py (1M JSON lines), same local[2] session. Each part is
the cheapest Spark form of one unavoidable step, timed warm (best of --reps runs, JIT
compiled, nothing cached from the run before):

  parse     read the lines and parse the fields the rules read, with from_json and a
            typed schema: cheaper than the rule language allows (it cannot tell 1 from
            "1", which keys and comparisons must), so a lower bound for the parse.
  velocity  the events velocity rules see (type != view) shuffled and sorted by
            (user, time), with one count over a 30 s range window: one of the ten rules.
  output    the detections bench_backtest.py writes (870k), as event text plus rule
            members and a sha2 id, sorted into one JSON Lines file.

The sum is a lower bound on the backtest's time: the engine also evaluates 62 rules,
nine more windows, two correlations, dead letters and the summary.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from bench_backtest import make_events  # noqa: E402

SCHEMA = ("type string, amount double, user_id string, merchant string, ts long, currency_pair string, "
          "implied_rate double")


def best(reps: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(reps):
        t = time.time()
        fn()
        times.append(time.time() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keep", type=Path)
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    from spark_jobs.spark import session

    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-floor-"))
    work.mkdir(parents=True, exist_ok=True)
    ev, ctx = work / "events.jsonl", work / "context.jsonl"
    if not ev.exists():
        make_events(ev, ctx, args.events)
    spark = session("backtest-floor", master="local[2]", shuffle_partitions=4)
    spark.range(10).count()

    def noop(df) -> Callable[[], None]:  # noqa: ANN001
        return lambda: df.write.format("noop").mode("overwrite").save()

    raw = spark.read.text(str(ev)).select(F.col("value").alias("raw"))
    parsed = raw.select("raw", F.from_json("raw", SCHEMA).alias("j")).select("raw", "j.*")
    parse_s = best(args.reps, noop(parsed))

    cached = parsed.persist()
    cached.count()
    window = Window.partitionBy("user_id").orderBy("ts").rangeBetween(-29_999, 0)
    velocity = (
        cached.filter(F.col("type") != "view").repartition("user_id").sortWithinPartitions("user_id", "ts")
        .select("raw", "ts", F.count(F.lit(1)).over(window).alias("n"))
    )
    velocity_s = best(args.reps, noop(velocity))

    # 870k of the 1M events, as bench_backtest.py's rules detect 870,033.
    head = ',"rule_id":"th_01","rule_version":"1","rule_type":"threshold","processed":"2026-01-01T00:00:00.000Z"'
    did = F.substring(F.sha2(F.concat_ws("\u001f", F.lit("th_01"), F.lit("1"), F.lit("events.raw"), "raw"), 256), 1, 32)
    body = F.expr("substring(raw, 1, length(raw) - 1)")
    detections = cached.filter(F.col("amount") >= 130).select(
        "ts", F.concat(body, F.lit(head), F.lit(',"detection_id":"'), did, F.lit('"}')).alias("value")
    )
    n_det = detections.count()
    out = str(work / "floor-detections")
    output_s = best(args.reps, lambda: detections.repartition(1).sortWithinPartitions("ts").select("value")
                    .write.mode("overwrite").text(out))
    total = parse_s + velocity_s + output_s
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}, local[2]")
    print(f"parse (from_json, 7 fields) of {args.events} events: {parse_s:.2f}s")
    print(f"velocity (shuffle, sort, one range window): {velocity_s:.2f}s")
    print(f"output ({n_det} detections rendered, sorted, one file): {output_s:.2f}s")
    print(f"floor: {total:.2f}s -> at most {args.events / total:,.0f} events/s")


if __name__ == "__main__":
    main()
