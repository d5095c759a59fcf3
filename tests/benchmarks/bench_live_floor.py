"""The floor under the live job: the same plumbing with no rules at all.

    python tests/benchmarks/bench_live_floor.py [--rate 20000] [--seconds 30] [--stateful | --jvm-rules]
    python tests/benchmarks/bench_live_floor.py --jvm-rules --backlog 300000 [--keep DIR]

What the detection job cannot avoid on this machine, measured the way bench_detect.py
measures the job (same producer, same latency from produce to the record on the sink
topic): Spark's own Kafka connector as source and sink, the JSON parse into
VARIANT and one field read, and the Kafka sink, with every event written back. With
`--stateful` every event also passes through a transformWithStateInPandas operator
grouped by a bucket of its user (one ValueState per bucket, one get and update per
call, every row emitted as is): the operator the design puts velocity and correlation
state in, doing no work of its own. Whatever the job does on top costs more; when this
floor misses a target, no rule evaluation can meet it.

`--jvm-rules`: the floor with the rules' work done by Spark's own JVM operators only,
as cheaply as this data allows (a lower bound on any engine, not an engine): the 50
threshold rules of bench_backtest.py as one generated `concat_ws` of their tests,
exploded, each detection written with the event; the velocity rules as one native
streaming aggregation (event-time tumbling windows of the smallest rule window per
user, count/sum/avg/min/max/approx distinct merchants in one state row, watermark 5 s)
whose updated rows are written each batch beside the events. Every event is written
once with the threshold rules it passes, and latency is measured on those records,
in the query that also runs the aggregation. Update output mode; no
correlation, no dead letters, no routing. Where this misses a target, the target is
beyond what Spark's own operators and connector do on this machine.

`--backlog N`: the floor under bench_backlog.py's drain instead of the live job. The
query is started (and with `--warmup W` drains bench_backlog.py's W warm-up events);
then bench_backtest.py's N events (the
file bench_backlog.py drains, event-time ordered, 20k users) are produced at once, and
the drain is timed from the first record sent to the end of the batch that read the
last one (the query's own progress: input rows summed over batches). Records carry no
`sent_ms`, so no latency is printed; `value` falls back to the raw event.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from bench_detect import consume_latencies, print_rate_and_latency, produce_events  # noqa: E402
from record import append_result  # noqa: E402

from spark_jobs.kafka.broker import EmbeddedBroker, free_port  # noqa: E402


def pass_through_processor():  # noqa: ANN201 - pyspark's StatefulProcessor, imported late
    from pyspark.sql.streaming import StatefulProcessor
    from pyspark.sql.types import LongType, StructField, StructType

    class PassThrough(StatefulProcessor):
        """Counts rows per bucket in state and emits every row unchanged."""

        def init(self, handle) -> None:  # noqa: ANN001
            self.count = handle.getValueState("n", StructType([StructField("n", LongType())]))

        def handleInputRows(self, key, rows: Iterator[pd.DataFrame], timerValues) -> Iterator[pd.DataFrame]:  # noqa: ANN001, N802
            n = self.count.get()[0] if self.count.exists() else 0
            for df in rows:
                n += len(df)
                yield df[["value"]]
            self.count.update((n,))

        def close(self) -> None:
            pass

    return PassThrough()


def jvm_rules(events):  # noqa: ANN001, ANN201 - pyspark DataFrames, imported late
    """The bench's threshold and velocity rules, hand-written in Spark's JVM operators:
    one stream of (value) rows, threshold detections and velocity window updates."""
    from bench_backtest import EVENT_TYPES, VELOCITY_AGGS, threshold_rule, velocity_window_s
    from pyspark.sql import functions as F

    from spark_jobs.engine.values import field

    v = F.col("v")
    typed = events.select(
        "raw",
        field(v, "type").cast("string").alias("type"),
        field(v, "user_id").cast("string").alias("user_id"),
        field(v, "merchant").cast("string").alias("merchant"),
        field(v, "amount").cast("double").alias("amount"),
        F.timestamp_millis(field(v, "ts").cast("long")).alias("ts"),
        field(v, "sent_ms").cast("long").alias("sent_ms"),
    )
    tests = [F.when((F.col("type") == F.lit(t)) & (F.col("amount") >= F.lit(m)), F.lit(f"th_{i:02d}"))
             for i, (t, m) in enumerate(threshold_rule(i) for i in range(50))]
    assert {threshold_rule(i)[0] for i in range(50)} <= set(EVENT_TYPES)
    # Every event once, with the threshold rules it passes (the latency is measured per
    # event record, as in the other modes).
    threshold = typed.select(F.concat(
        F.lit('{"sent_ms":'), F.coalesce(F.col("sent_ms").cast("string"), F.lit("null")), F.lit(',"rules":"'), F.concat_ws(",", *tests),
        F.lit('","event":'), "raw", F.lit("}")).alias("value"))
    window = f"{min(velocity_window_s(i) for i in range(len(VELOCITY_AGGS)))} seconds"
    velocity = typed.filter(F.col("type") != F.lit("view")).withWatermark("ts", "5 seconds") \
        .groupBy("user_id", F.window("ts", window)).agg(
            F.count(F.lit(1)).alias("n"), F.sum("amount").alias("s"), F.avg("amount").alias("a"),
            F.min("amount").alias("lo"), F.max("amount").alias("hi"),
            F.approx_count_distinct("merchant").alias("d"), F.max("sent_ms").alias("newest_sent_ms")) \
        .select(F.to_json(F.struct("user_id", "n", "s", "a", "lo", "hi", "d", "newest_sent_ms")).alias("value"))
    return threshold.unionByName(velocity)


def input_rows(query) -> int:  # noqa: ANN001 - a pyspark StreamingQuery
    """Rows the query has read, summed over the batches it still reports (100 by default;
    the backlog takes a handful)."""
    return sum(p["numInputRows"] for p in query.recentProgress)


def drain_backlog(query, bootstrap: str, args: argparse.Namespace) -> None:  # noqa: ANN001
    """Warm the query, produce the backlog at once and time until the query has read it."""
    from bench_backlog import produce_file, warmup_file
    from bench_backtest import prepare

    _, ev, _ = prepare(args.keep, args.backlog, "bench-floor-backlog-")
    if args.warmup:
        # bench_backlog.py's warm-up: older events of other users, so no backlog event is
        # behind the watermark (late rows would skip the aggregation).
        warm, _ = produce_file(bootstrap, warmup_file(ev, args.warmup))
        while input_rows(query) < warm:
            time.sleep(0.2)
        time.sleep(2)
    before = input_rows(query)
    start = time.time()
    n, produced_s = produce_file(bootstrap, ev)
    while input_rows(query) < before + n and time.time() - start < 1800:
        time.sleep(0.1)
    drain_s = time.time() - start
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}, Spark local[2], "
          f"trigger {args.trigger_ms} ms, max offsets per trigger {args.max_offsets}, "
          f"{'the rules as Spark own JVM operators' if args.jvm_rules else 'no rules'}, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"produced {n} records in {produced_s:.1f}s; drained (every record read and written) after "
          f"{drain_s:.1f}s -> {n / drain_s:,.0f} events/s")
    append_result("live_floor", {"events_per_s": round(n / drain_s), "drain_s": round(drain_s, 1),
                                 "produced_s": round(produced_s, 1)}, **_variant(args), backlog=n, warmup=args.warmup)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=int, default=20_000)
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--users", type=int, default=2_000)
    ap.add_argument("--trigger-ms", type=int, default=500)
    ap.add_argument("--stateful", action="store_true", help="pass every event through transformWithStateInPandas")
    ap.add_argument("--buckets", type=int, default=32, help="groups of the stateful operator (the job's default)")
    ap.add_argument("--conf", action="append", default=[], help="extra Spark setting KEY=VALUE (repeatable)")
    ap.add_argument("--jvm-rules", action="store_true",
                    help="the bench's threshold and velocity rules as Spark's own JVM operators (module docstring)")
    ap.add_argument("--backlog", type=int, help="drain N backlog events instead of a live rate (module docstring)")
    ap.add_argument("--keep", type=Path, help="with --backlog: use/generate the events in DIR (bench_backtest layout)")
    ap.add_argument("--warmup", type=int, default=0, metavar="N",
                    help="with --backlog: drain bench_backlog.py's N warm-up events first, untimed")
    ap.add_argument("--max-offsets", type=int, default=100_000, help="maxOffsetsPerTrigger (the job's default)")
    ap.add_argument("--real-time", metavar="DURATION",
                    help="Spark's real-time mode (trigger realTime=DURATION, update mode) instead of micro-batches")
    args = ap.parse_args()
    from pyspark.sql import functions as F

    from spark_jobs.engine.events import classify
    from spark_jobs.engine.values import field
    from spark_jobs.kafka.spark_io import read_stream, write_stream
    from spark_jobs.spark import session
    from spark_jobs.streaming.job import STATE_STORE

    work = Path(tempfile.mkdtemp(prefix="bench-floor-"))
    with EmbeddedBroker(port=free_port()) as broker:
        extra = {"spark.sql.streaming.stateStore.providerClass": STATE_STORE,
                 **dict(c.split("=", 1) for c in args.conf)}
        spark = session("live-floor", extra=extra)
        # Real-time mode runs one long-lived task per Kafka partition and reads what
        # arrives: no rate limit, no split of partitions.
        raw = read_stream(spark, broker.bootstrap, ["events.raw"],
                          max_offsets_per_trigger=None if args.real_time else args.max_offsets,
                          min_partitions=None if args.real_time else 4)
        events = classify(raw.select(F.col("value").cast("string").alias("raw")))
        out = events.select(F.col("raw").alias("value"), F.to_json(field(F.col("v"), "user_id")).alias("k"))
        if args.stateful:
            from pyspark.sql.types import StringType, StructField, StructType

            out = out.withColumn("bucket", F.pmod(F.xxhash64("k"), F.lit(args.buckets)).cast("int")).groupBy(
                "bucket"
            ).transformWithStateInPandas(
                pass_through_processor(), StructType([StructField("value", StringType())]), "Append", "None"
            )
        mode = "update" if args.real_time else "append"
        if args.jvm_rules:
            out, mode = jvm_rules(events), "update"
        query = (
            write_stream(out.select(F.lit("events.processed").alias("topic"), "value"), broker.bootstrap)
            .outputMode(mode)
            .option("checkpointLocation", str(work / "ckpt"))
            .trigger(**({"realTime": args.real_time} if args.real_time
                        else {"processingTime": f"{args.trigger_ms} milliseconds"}))
            .start()
        )
        if args.backlog:
            drain_backlog(query, broker.bootstrap, args)
            query.stop()
            spark.stop()
            return
        lat: list[float] = []
        stop = threading.Event()
        consumer = threading.Thread(target=consume_latencies, args=(broker.bootstrap, stop, lat), daemon=True)
        consumer.start()
        # Warm-up, not measured: the first batches with data start the Python workers
        # and JIT-compile the plan.
        produce_events(broker.bootstrap, 1000, 2, args.users)
        while len(lat) < 2000:
            time.sleep(0.2)
        time.sleep(2)
        lat.clear()
        total = args.rate * args.seconds
        start = time.time()
        produced_s = produce_events(broker.bootstrap, args.rate, args.seconds, args.users)
        while len(lat) < total and time.time() - start < 1800:
            time.sleep(0.2)
        done_s = time.time() - start
        stop.set()
        consumer.join(5)
        query.stop()
        spark.stop()
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}, Spark local[2], "
          + (f"real-time mode, batch duration {args.real_time}, " if args.real_time else f"trigger {args.trigger_ms} ms, ")
          + ("the rules as Spark's own JVM operators" if args.jvm_rules
             else f"{'with' if args.stateful else 'without'} a stateful operator"))
    print(f"produced {total} events in {produced_s:.1f}s (target {args.rate}/s); all on the sink after {done_s:.1f}s")
    figures = print_rate_and_latency(total, done_s, lat, "record")
    append_result("live_floor", {**figures, "produced_s": round(produced_s, 1), "on_sink_s": round(done_s, 1)},
                  **_variant(args), rate=args.rate, seconds=args.seconds, users=args.users)


def _variant(args: argparse.Namespace) -> dict:
    """What was measured: the plan's kind and its trigger."""
    kind = "jvm-rules" if args.jvm_rules else "stateful" if args.stateful else "no rules"
    trigger = f"real-time {args.real_time}" if args.real_time else f"{args.trigger_ms} ms"
    return {"variant": kind, "trigger": trigger}


if __name__ == "__main__":
    main()
