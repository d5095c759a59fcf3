"""Live job throughput on the one-machine cluster: three Kafka brokers, a Spark standalone
master and 1 or 2 workers (1 core, 1g each), the job in client mode.

    python tests/benchmarks/bench_cluster.py [--events 120000] [--workers 1 2]

Produces a backlog of events (two velocity rules and a threshold rule over 2000 users,
event time in order) into `events.raw` (4 partitions, replication 3), then for each
worker count starts a fresh cluster and `rulectl detect --master spark://...` on a fresh
checkpoint and times the drain: events / (time of the batch that brought the lag to 0 -
time of the first batch). Prints one line per worker count.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from confluent_kafka import Producer

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from cluster_helpers import free_block  # noqa: E402
from detect_harness import DetectJob  # noqa: E402
from record import append_result  # noqa: E402

from spark_jobs.kafka.cluster import KafkaCluster  # noqa: E402
from spark_jobs.kafka.publisher import publish_rules  # noqa: E402
from spark_jobs.platform.spark_cluster import LocalSparkCluster  # noqa: E402
from spark_jobs.rules.model import parse_rule  # noqa: E402

RULES = [
    {"rule_id": "burst_per_user", "version": "1", "rule_type": "velocity", "source_topic": "events.raw",
     "group_by": "user", "window_size": 60, "window_unit": "seconds", "aggregation_type": "count", "threshold": 5,
     "time_mode": "event_time", "timestamp_field": "ts", "watermark_delay": 30},
    {"rule_id": "spend_per_user", "version": "1", "rule_type": "velocity", "source_topic": "events.raw",
     "group_by": "user", "window_size": 300, "window_unit": "seconds", "aggregation_type": "sum",
     "aggregation_field": "amount", "threshold": 900, "time_mode": "event_time", "timestamp_field": "ts"},
    {"rule_id": "big_amount", "version": "1", "rule_type": "threshold", "source_topic": "events.raw",
     "conditions": [{"field": "amount", "operator": ">=", "value": 99}]},
]


def produce(bootstrap: str, n: int, users: int = 2000) -> None:
    rng = random.Random(7)
    t = datetime(2026, 6, 1, tzinfo=UTC)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 20})
    for i in range(n):
        t += timedelta(milliseconds=rng.randint(1, 20))
        user = f"u{rng.randrange(users)}"
        value = json.dumps({"eid": i, "user": user, "amount": rng.randint(1, 100), "ts": t.isoformat()}).encode()
        while True:
            try:
                p.produce("events.raw", key=user.encode(), value=value)
                break
            except BufferError:  # the local queue is full: let deliveries drain
                p.poll(0.5)
        p.poll(0)
    assert p.flush(120) == 0


def drain(kafka: KafkaCluster, work: Path, workers: int, n: int) -> float:
    port = free_block(1, 46000)
    ui = free_block(workers + 1, port + 50)
    with LocalSparkCluster(work / f"spark-{workers}", workers=workers, port=port, webui_port=ui) as spark:
        job = DetectJob(kafka.bootstrap, work / f"detect-{workers}", max_offsets_per_trigger=20_000,
                        trigger_ms=0, extra_args=("--master", spark.master_url))
        job.start(timeout=300)
        try:
            first = job.status()
            t0 = time.monotonic()
            # The backlog was produced before the start: lag 0 = everything read.
            job.wait_for(lambda s: s.get("lag") == 0, 1800)
            elapsed = time.monotonic() - t0
            rows_first = first.get("num_input_rows") or 0
        finally:
            job.stop()
    return (n - rows_first) / elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=120_000)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-cluster-") as tmp:
        work = Path(tmp)
        kport = free_block(3, 43000)
        with KafkaCluster(work / "kafka", port=kport, controller_port=kport + 500,
                          partitions={"events.raw": 4, "events.processed": 2}) as kafka:
            publish_rules([parse_rule(r) for r in RULES], kafka.bootstrap)
            produce(kafka.bootstrap, args.events)
            for w in args.workers:
                rate = drain(kafka, work, w, args.events)
                print(f"workers={w} (1 core, 1g each): {rate:,.0f} events/s over {args.events:,} events", flush=True)
                append_result("cluster", {"events_per_s": round(rate)}, workers=w, events=args.events)


if __name__ == "__main__":
    main()
