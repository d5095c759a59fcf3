"""The JVM cost of the live job's plan, part by part, without the stateful operator.

    python tests/benchmarks/bench_live_plan.py [--events 300000] [--users 2000]

Produces the bench_detect.py events into a real Kafka broker, then runs the live job's
own plan pieces (job.py: `classify`, `event_rows`: the first operator's input) as batch queries
over the topic through Spark's Kafka connector, each written to Spark's noop sink, twice
(the second, warm run is printed). Prints wall time, events/s and the Spark JVM's CPU
seconds per event: the CPU figure is what to compare between runs on a loaded machine,
where wall time is not. Keyed rows per event says how many rows the stateful operator
would get (one per (event, key group), and one per event carried through it), and the
(event, rule) pairs they carry.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

import yaml
from confluent_kafka import Producer
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from bench_backtest import jvm_cpu_s, make_rules  # noqa: E402
from record import append_result  # noqa: E402

from spark_jobs.engine.events import classify  # noqa: E402
from spark_jobs.kafka import admin  # noqa: E402
from spark_jobs.kafka.broker import EmbeddedBroker, free_port  # noqa: E402
from spark_jobs.kafka.spark_io import read_batch  # noqa: E402
from spark_jobs.rules.model import parse_rule  # noqa: E402
from spark_jobs.spark import session  # noqa: E402
from spark_jobs.streaming import job  # noqa: E402
from spark_jobs.streaming.registry import ROUTED_TOPIC  # noqa: E402
from spark_jobs.streaming.rule_versions import publish  # noqa: E402
from spark_jobs.streaming.rules_source import rows_of  # noqa: E402


def produce(bootstrap: str, n: int, users: int) -> None:
    admin.create_topics(bootstrap, ["events.raw"])
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20})
    rnd = random.Random(1)
    types = ["purchase", "click", "view", "transfer"]
    pairs = ["EURUSD", "GBPUSD", "USDJPY", "AUDUSD"]
    now = int(time.time() * 1000)
    for i in range(n):
        ev = {"event_id": i, "type": types[rnd.randrange(4)], "user_id": f"u{rnd.randrange(users)}",
              "amount": rnd.randrange(1000), "merchant": f"m{rnd.randrange(50)}", "ts": now + i, "sent_ms": now}
        if i % 10 == 0:
            ev["currency_pair"] = pairs[rnd.randrange(4)]
            ev["implied_rate"] = round(1 + rnd.random() * 0.1, 4)
        p.produce("events.raw", json.dumps(ev, separators=(",", ":")).encode())
        if i % 10_000 == 0:
            p.poll(0)
    p.flush(60)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--users", type=int, default=2_000)
    ap.add_argument("--threshold-lane", choices=["micro-batch", "real-time"], default="micro-batch",
                    help="real-time: the keyed query's plan when the real-time lane judges the threshold rules")
    ap.add_argument("--max-fields", type=int, default=100,
                    help="spark.sql.codegen.maxFields (Spark's default, which the job keeps)")
    args = ap.parse_args()
    n = args.events
    work = Path(tempfile.mkdtemp(prefix="bench-live-plan-"))
    with EmbeddedBroker(port=free_port(), data_dir=work / "kafka") as broker:
        produce(broker.bootstrap, n, args.users)
        (work / "rules").mkdir()
        make_rules(work / "rules")
        rules = {r["rule_id"]: parse_rule(r).model_dump(mode="json")
                 for r in yaml.safe_load((work / "rules" / "bench.yaml").read_text())}
        rows = rows_of(json.loads(json.dumps(rules)), ROUTED_TOPIC)
        spark = session("bench-live-plan", extra={"spark.sql.codegen.maxFields": str(args.max_fields)})
        records = read_batch(spark, broker.bootstrap, ["events.raw"], options={"minPartitions": "4"})
        raw = classify(records.select(
            F.col("topic").alias("in_topic"), "topic",
            (F.col("partition").cast("long") * F.lit(1 << 40) + F.col("offset")).alias("seq"),
            F.lit(None).cast("string").alias("route_from"), F.col("value").cast("string").alias("raw"),
            F.unix_millis("timestamp").alias("proc_ms"), F.lit(None).cast("string").alias("_quarantine"),
        ))

        parts: dict[str, dict] = {}

        def timed(name: str, df: DataFrame) -> None:
            for _ in range(2):  # the second run is warm
                cpu0, t0 = jvm_cpu_s(spark), time.time()
                df.write.format("noop").mode("overwrite").save()
                wall, cpu = time.time() - t0, jvm_cpu_s(spark) - cpu0
            print(f"{name}: {wall:.2f} s, {n / wall:,.0f} events/s; JVM CPU {cpu:.1f} s = {cpu / n * 1e6:.1f} us/event",
                  flush=True)
            parts[name] = {"wall_s": round(wall, 2), "events_per_s": round(n / wall),
                           "jvm_cpu_us_per_event": round(cpu / n * 1e6, 1)}

        print(f"machine: {platform.machine()} {platform.processor() or ''}, python {platform.python_version()}, "
              f"Spark local[2]; {n} events, {args.users} users, {len(rows)} rule rows")
        timed("Kafka read", records)
        timed("Kafka read + classify (VARIANT parse)", raw)
        versions = Path(tempfile.mkdtemp(prefix="bench-live-plan-"))
        publish(versions, rows)
        keyed = job.event_rows(raw, versions, max_ahead_ms=10**12, thresholds=args.threshold_lane == "micro-batch")
        timed("event_rows (the first operator's input)", keyed)
        # Operator rows: one per (event, key group) and the pass rows (threshold matches,
        # dead letters); (event, rule) pairs: the indexes they carry.
        passes = F.col("gid") == F.lit(job.PASS_GID)
        counts = keyed.select(F.count("*").alias("rows"), F.sum(passes.cast("int")).alias("carried"),
                              F.sum(F.when(~passes, F.size("mem"))).alias("pairs")).first()
        keyed_rows = sum(r.rule_type != "threshold" for r in rows)
        print(f"operator rows per event: {counts['rows'] / n:.2f}, of which carried {counts['carried'] / n:.2f} "
              f"((event, keyed rule) pairs per event: {counts['pairs'] / n:.2f}, {keyed_rows} keyed rule rows)")
        spark.stop()
    append_result("live_plan", {
        "read_us_per_event": parts["Kafka read"]["jvm_cpu_us_per_event"],
        "classify_us_per_event": parts["Kafka read + classify (VARIANT parse)"]["jvm_cpu_us_per_event"],
        "event_rows_us_per_event": parts["event_rows (the first operator's input)"]["jvm_cpu_us_per_event"],
        "operator_rows_per_event": round(counts["rows"] / n, 2), "parts": parts,
    }, events=n, users=args.users, threshold_lane=args.threshold_lane, max_fields=args.max_fields)


if __name__ == "__main__":
    main()
