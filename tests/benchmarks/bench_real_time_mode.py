"""Spark's real-time mode under the live job: what it accepts, and what a stateful query gets.

    python tests/benchmarks/bench_real_time_mode.py [--batch-duration "20 seconds"]

Real-time mode (Spark 4.1+, `trigger(realTime=...)`) runs one long-lived task per Kafka
partition and writes each record as it is processed, instead of micro-batches: it is
the stack's lowest-latency engine, so a latency floor quoted for the live job must say
why it is not measured with it. This script asks Spark 4.2 itself, on a real broker
with Spark's Kafka connector:

1. which of the live job's operator kinds real-time mode starts: a stateless query
   (parse and write back), a streaming aggregation (the floor's velocity rules,
   `bench_live_floor.py --jvm-rules`), deduplication, and the live plan itself (JVM
   transformWithState, `job.build`), in update mode (it refuses append mode at start);
2. as a control, that the live plan runs as micro-batches in the same session;
3. with Spark's allowlist check switched off (`spark.sql.streaming.realTimeMode.
   allowlistCheck` false), how long a stateful query's first result takes after its
   events are produced, against the batch duration: the shuffle in front of a state
   store is not pipelined in 4.2, so its reducers only run when the long-lived batch ends.

`bench_live_floor.py --real-time DURATION` measures the stateless part's latency.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from detect_harness import job_state_store, produce  # noqa: E402
from record import append_result  # noqa: E402

from spark_jobs.engine.events import classify  # noqa: E402
from spark_jobs.engine.values import field  # noqa: E402
from spark_jobs.kafka.admin import create_topics, read_all  # noqa: E402
from spark_jobs.kafka.broker import EmbeddedBroker, free_port  # noqa: E402
from spark_jobs.kafka.spark_io import read_stream, write_stream  # noqa: E402
from spark_jobs.rules.model import parse_rule  # noqa: E402
from spark_jobs.spark import session  # noqa: E402
from spark_jobs.streaming.job import STATE_STORE, DetectConfig, build  # noqa: E402
from spark_jobs.streaming.registry import ROUTED_TOPIC  # noqa: E402
from spark_jobs.streaming.rules_source import rows_of  # noqa: E402

TOPIC, OUT, DEAD = "rtm.events", "rtm.out", "rtm.dead"
RULES = [
    {"rule_id": "big", "version": "1", "rule_type": "threshold", "source_topic": TOPIC, "owner": "bench",
     "conditions": [{"field": "amount", "operator": ">", "value": 10}]},
    {"rule_id": "burst", "version": "1", "rule_type": "velocity", "source_topic": TOPIC, "owner": "bench",
     "group_by": "user_id", "window_size": 60, "window_unit": "seconds", "aggregation_type": "count",
     "threshold": 2, "emit_mode": "all_events", "time_mode": "event_time", "timestamp_field": "ts"},
]


def events(spark, bootstrap: str) -> DataFrame:  # noqa: ANN001
    raw = read_stream(spark, bootstrap, [TOPIC])
    return classify(raw.select(F.col("value").cast("string").alias("raw")))


def aggregation(ev: DataFrame) -> DataFrame:
    """Counts per user and event-time window: the floor's velocity rules in miniature."""
    v = F.col("v")
    agg = ev.select(field(v, "user_id").cast("string").alias("u"),
                    F.timestamp_millis(field(v, "ts").cast("long")).alias("ts")) \
        .withWatermark("ts", "5 seconds").groupBy("u", F.window("ts", "60 seconds")).count()
    return agg.select(F.lit(OUT).alias("topic"), F.to_json(F.struct("u", "count")).alias("value"))


def outcome(query, wait_s: float = 30) -> str:  # noqa: ANN001 - a pyspark StreamingQuery
    """How a started query fares within `wait_s`: its error's first line, or running."""
    t0 = time.time()
    while time.time() - t0 < wait_s and query.isActive and query.exception() is None:
        time.sleep(1)
    exc = query.exception()
    with contextlib.suppress(Exception):  # a failed query may refuse to stop again
        query.stop()
    return f"FAILED: {str(exc).splitlines()[0][:300]}" if exc else f"runs ({wait_s:.0f} s)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-duration", default="20 seconds", help="real-time batch duration (checkpoint interval)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-rtm-"))
    with EmbeddedBroker(port=free_port()) as broker:
        bootstrap = broker.bootstrap
        spark = session("bench-real-time-mode", extra={"spark.sql.streaming.stateStore.providerClass": STATE_STORE})
        create_topics(bootstrap, [TOPIC, OUT, DEAD])
        produce(bootstrap, TOPIC, [json.dumps({"user_id": f"u{i % 3}", "amount": 5 + i, "ts": 1_700_000_000_000 + i})
                                   for i in range(20)])
        rules = {r["rule_id"]: parse_rule(r).model_dump(mode="json") for r in RULES}
        cfg = DetectConfig(bootstrap=bootstrap, checkpoint=work / "live", sink_topic=OUT, dead_letter_topic=DEAD)
        rows = rows_of(rules, ROUTED_TOPIC)
        def live_plan() -> DataFrame:
            return build(spark, cfg, 0.0, [TOPIC], rows)

        cases = {
            "stateless (parse, write back)": lambda: events(spark, bootstrap).select(
                F.lit(OUT).alias("topic"), F.col("raw").alias("value")),
            "streaming aggregation": lambda: aggregation(events(spark, bootstrap)),
            "dropDuplicates": lambda: events(spark, bootstrap).dropDuplicates(["raw"]).select(
                F.lit(OUT).alias("topic"), F.col("raw").alias("value")),
            "the live plan (JVM transformWithState)": live_plan,
        }
        print(f"Spark {spark.version}, real-time mode, batch duration {args.batch_duration}, local[2]")
        outcomes: dict[str, str] = {}
        # Update mode: real-time mode refuses append mode at start, whatever the query.
        for i, (name, plan) in enumerate(cases.items()):
            writer = (write_stream(plan(), bootstrap).outputMode("update")
                      .option("checkpointLocation", str(work / f"case{i}"))
                      .trigger(realTime=args.batch_duration))
            try:
                with job_state_store(spark):
                    query = writer.start()
            except Exception as exc:  # noqa: BLE001 - Spark refuses at start: that is the finding
                outcomes[name] = f"REFUSED: {str(exc).splitlines()[0][:300]}"
                print(f"  {name}: {outcomes[name]}")
                continue
            outcomes[name] = outcome(query)
            print(f"  {name}: {outcomes[name]}")

        # Control: the same live plan as micro-batches (how the job runs it) starts and runs.
        with job_state_store(spark):
            query = (write_stream(live_plan(), bootstrap)
                     .option("checkpointLocation", str(work / "control")).trigger(processingTime="500 milliseconds")
                     .start())
        control = outcomes["control: the live plan as micro-batches (append mode)"] = outcome(query)
        print(f"  control, the live plan as micro-batches (append mode): {control}")

        # The allowlist switched off: a stateful query runs, but how soon does it write?
        spark.conf.set("spark.sql.streaming.realTimeMode.allowlistCheck", "false")
        with job_state_store(spark):
            query = (write_stream(live_plan(), bootstrap).outputMode("update")
                     .option("checkpointLocation", str(work / "live-bypass"))
                     .trigger(realTime=args.batch_duration).start())
        bypass = outcomes["the live plan with the allowlist check off"] = outcome(query)
        print(f"  the live plan with the allowlist check off: {bypass}")
        query = (write_stream(aggregation(events(spark, bootstrap)), bootstrap).outputMode("update")
                 .option("checkpointLocation", str(work / "bypass")).trigger(realTime=args.batch_duration).start())
        time.sleep(8)  # started and reading
        before = len(read_all(bootstrap, OUT, timeout=2))
        t0 = time.time()
        produce(bootstrap, TOPIC, [json.dumps({"user_id": f"late{i % 3}", "ts": int(t0 * 1000) + i}) for i in range(30)])
        first = None
        while time.time() - t0 < 120 and query.exception() is None:
            if len(read_all(bootstrap, OUT, timeout=1)) > before:
                first = time.time() - t0
                break
            time.sleep(0.5)
        print("  streaming aggregation with the allowlist check off: "
              + (f"first result on the sink {first:.1f} s after its events were produced" if first is not None
                 else f"no result within 120 s ({query.exception()})"))
        query.stop()
        version = spark.version
        spark.stop()
    append_result("real_time_mode", {
        "stateless_accepted": not outcomes["stateless (parse, write back)"].startswith(("REFUSED", "FAILED")),
        "stateful_accepted": not outcomes["the live plan (JVM transformWithState)"].startswith(("REFUSED", "FAILED")),
        "bypass_first_result_s": None if first is None else round(first, 1), "outcomes": outcomes,
    }, spark_version=version, batch_duration=args.batch_duration)


if __name__ == "__main__":
    main()
