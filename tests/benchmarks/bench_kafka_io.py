"""Benchmark: sustained Spark streaming read rate through the `kafka_py` source.

Not a test (pytest does not collect it): run it by hand,

    .venv/bin/python tests/benchmarks/bench_kafka_io.py [--events 200000] [--per-trigger 40000]

It starts its own embedded broker on a free port, produces small JSON events (the shape
of the demo's events.raw), then streams them through Spark into the `noop` sink with
`maxOffsetsPerTrigger`, so the run has many micro-batches. The first batch pays Spark's
and the Python workers' start-up costs, so the figure that matters is the sustained rate
over the other batches: their rows / the sum of their trigger durations.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from confluent_kafka import Producer


def produce_events(bootstrap: str, topic: str, n: int, partitions: int) -> float:
    """Produce `n` JSON events round-robin over partitions; returns records/s."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.num.messages": 10_000})
    t0 = time.perf_counter()
    for i in range(n):
        value = json.dumps(
            {
                "event_id": f"e{i}",
                "user": {"id": f"u{i % 1000}"},
                "amount": round(i % 500 + 0.5, 2),
                "timestamp": 1_700_000_000_000 + i,
            }
        )
        while True:
            try:
                producer.produce(topic, key=f"u{i % 1000}", value=value, partition=i % partitions)
                break
            except BufferError:
                producer.poll(0.01)
    remaining = producer.flush(60)
    if remaining:
        raise RuntimeError(f"{remaining} events not delivered")
    return n / (time.perf_counter() - t0)


def reader_only_rate(bootstrap: str, topic: str, partition: int, end: int, chunk: int) -> float:
    """One partition read by the executor-side code alone (no Spark), in `chunk`-sized ranges.

    Separates the reader's own speed from Spark's per-batch overhead: this is what one
    Spark task can deliver at most.
    """
    from spark_jobs.kafka.datasource import KAFKA_SCHEMA, KafkaInputPartition, ReaderOptions, read_range

    opts = ReaderOptions.parse({"kafka.bootstrap.servers": bootstrap, "subscribe": topic})
    list(read_range(opts, KAFKA_SCHEMA, KafkaInputPartition(topic, partition, 0, 10)))  # imports, connection
    t0 = time.perf_counter()
    rows = 0
    for start in range(0, end, chunk):
        part = KafkaInputPartition(topic, partition, start, min(start + chunk, end))
        rows += sum(batch.num_rows for batch in read_range(opts, KAFKA_SCHEMA, part))
    return rows / (time.perf_counter() - t0)


def run(events: int, per_trigger: int, partitions: int) -> dict:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    from spark_jobs.kafka.broker import EmbeddedBroker, free_port
    from spark_jobs.kafka.datasource import read_stream

    with EmbeddedBroker(port=free_port(), topics=["events.raw"], partitions=partitions) as broker:
        produce_rate = produce_events(broker.bootstrap, "events.raw", events, partitions)
        per_partition = events // partitions
        reader_rate = reader_only_rate(
            broker.bootstrap, "events.raw", 0, per_partition, max(1, per_trigger // partitions)
        )
        spark = (
            SparkSession.builder.master("local[2]")
            .appName("bench_kafka_io")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.ui.enabled", "false")
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        try:
            with tempfile.TemporaryDirectory() as ckpt:
                df = read_stream(spark, broker.bootstrap, "events.raw", max_offsets_per_trigger=per_trigger)
                t0 = time.perf_counter()
                query = (
                    df.writeStream.format("noop")
                    .option("checkpointLocation", ckpt)
                    .trigger(availableNow=True)
                    .start()
                )
                query.awaitTermination()
                wall = time.perf_counter() - t0
                progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
        finally:
            spark.stop()
    rows = [p["numInputRows"] for p in progress]
    durations = [p["durationMs"]["triggerExecution"] / 1000.0 for p in progress]
    sustained_rows, sustained_s = sum(rows[1:]), sum(durations[1:])
    return {
        "events": events,
        "partitions": partitions,
        "max_offsets_per_trigger": per_trigger,
        "produce_rate": round(produce_rate),
        "reader_only_records_per_s_one_partition": round(reader_rate),
        "batches": len(rows),
        "rows_read": sum(rows),
        "first_batch_s": round(durations[0], 2) if durations else None,
        "wall_s_including_first_batch": round(wall, 2),
        "sustained_records_per_s": round(sustained_rows / sustained_s) if sustained_s else None,
        "batch_rows": rows,
        "batch_seconds": [round(d, 2) for d in durations],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=200_000)
    parser.add_argument("--per-trigger", type=int, default=40_000)
    parser.add_argument("--partitions", type=int, default=2)
    args = parser.parse_args()
    result = run(args.events, args.per_trigger, args.partitions)
    print(json.dumps(result, indent=2))
    if result["rows_read"] != args.events:
        print(f"ERROR: read {result['rows_read']} of {args.events} events", file=sys.stderr)
        return 1
    print(f"sustained read rate: {result['sustained_records_per_s']} records/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
