"""Each live lane against its floor, side by side in one run on one broker.

    python tests/benchmarks/bench_lanes.py [--rate 5000] [--seconds 30] [--warmup 15]
                                           [--rules 62,300,1000]

One embedded broker, one load (bench_detect.py's events: `sent_ms` in each, ~0.3
detections an event), and these phases one after the other, each alone on the machine:

1. the stateless floor: Spark's minimal real-time query, Kafka -> parse (VARIANT) ->
   Kafka, real-time batches of 1 s (the threshold lane's setting);
2. the keyed floor: Kafka -> parse -> `groupBy(user_id).count()` -> Kafka, micro-batches
   every 500 ms in update mode (the keyed lane's trigger), on Spark's RocksDB state store;
3. both floors at once in one application: the job runs its two lanes as two queries on
   the same cores, so this is the floor of that design (each query doing less than ours);
4. `rulectl detect --threshold-lane real-time` with the benchmark's 62 rules, then with
   rare threshold rules added up to each count of `--rules` (each matches about one event
   in ten thousand, bench_detect.py `rare_rules`).

Latency is from the event's produce time to its record on the phase's output topic, read
by a consumer on the same machine. Prints each lane's p50/p99 and the ratio of its p99 to
its floor's: the threshold lane against the stateless floor, the velocity rules against
the keyed floor, each alone and run together; and the keyed query's median batch over
the phase (its warm-up included).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml
from confluent_kafka import OFFSET_END, Consumer, TopicPartition

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from bench_backtest import make_rules  # noqa: E402
from bench_detect import print_batches, produce_events, rare_rules, sample_batches  # noqa: E402
from detect_harness import DetectJob  # noqa: E402
from record import append_result  # noqa: E402

from spark_jobs.kafka.admin import create_topics, topic_partitions  # noqa: E402
from spark_jobs.kafka.broker import EmbeddedBroker, free_port  # noqa: E402
from spark_jobs.kafka.publisher import publish_rules  # noqa: E402
from spark_jobs.rules.model import parse_rule  # noqa: E402
from spark_jobs.streaming.job import LANE_FETCH  # noqa: E402

BENCH_RULES = 62  # bench_backtest.make_rules: 50 threshold, 10 velocity, 2 correlation


class Latencies:
    """Produce-to-output latencies (ms) of one topic's new records, by rule type."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.by_type: dict[str, list[float]] = {}
        self._stop = threading.Event()
        self._consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"lanes-{topic}",
                                   "enable.auto.commit": False})
        parts = topic_partitions(bootstrap, topic)
        self._consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in parts])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            for m in self._consumer.consume(1000, 0.2):
                if m.error():
                    continue
                now = time.time() * 1000
                ev = json.loads(m.value())
                if ev.get("sent_ms") and not ev.get("warmup"):
                    self.by_type.setdefault(ev.get("rule_type", "record"), []).append(now - ev["sent_ms"])

    def count(self) -> int:
        return sum(len(v) for v in self.by_type.values())

    def settle(self, quiet_s: float = 3.0, timeout_s: float = 300.0) -> None:
        """Until no record came for `quiet_s`."""
        start, last, seen = time.time(), time.time(), -1
        while time.time() - start < timeout_s:
            n = self.count()
            if n != seen:
                seen, last = n, time.time()
            elif time.time() - last > quiet_s:
                return
            time.sleep(0.2)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._consumer.close()

    def figures(self, rule_type: str) -> dict:
        lat = sorted(self.by_type.get(rule_type, []))
        if not lat:
            return {}
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        return {"n": len(lat), "p50_s": round(statistics.median(lat) / 1000, 3), "p99_s": round(p99 / 1000, 3)}


def measure(bootstrap: str, out_topics: list[str], args: argparse.Namespace, rare: int = 0) -> dict[str, Latencies]:
    """Warm-up load (left out), then the measured load; the latencies on each of `out_topics`."""
    lats = {t: Latencies(bootstrap, t) for t in out_topics}
    produce_events(bootstrap, args.rate, args.warmup, args.users, warmup=True, rare=rare)
    for lat in lats.values():
        lat.settle()
    produce_events(bootstrap, args.rate, args.seconds, args.users, rare=rare)
    for lat in lats.values():
        lat.settle()
        lat.close()
    return lats


def floors(bootstrap: str, work: Path, args: argparse.Namespace) -> dict[str, dict]:
    from pyspark.sql import functions as F

    from spark_jobs.engine.events import classify
    from spark_jobs.engine.values import field
    from spark_jobs.kafka.spark_io import read_stream, write_stream
    from spark_jobs.spark import session
    from spark_jobs.streaming.job import STATE_STORE
    from spark_jobs.streaming.threshold_lane import LANE_BATCH_MS, MIN_BATCH_CONF

    create_topics(bootstrap, ["floor.stateless", "floor.keyed"])
    spark = session("lanes-floor", streaming=True, extra={
        "spark.sql.streaming.stateStore.providerClass": STATE_STORE,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        MIN_BATCH_CONF: str(LANE_BATCH_MS)})
    out: dict[str, dict] = {}

    def parsed():
        return classify(read_stream(spark, bootstrap, ["events.raw"], starting_offsets="latest")
                        .select(F.col("value").cast("string").alias("raw")))

    def stateless_floor(name: str):
        return (write_stream(parsed().select(F.lit("floor.stateless").alias("topic"), F.col("raw").alias("value")),
                             bootstrap)
                .outputMode("update").option("checkpointLocation", str(work / f"floor-stateless-{name}"))
                .trigger(realTime=f"{LANE_BATCH_MS} milliseconds").start())

    def keyed_floor(name: str):
        counts = parsed().select(field(F.col("v"), "user_id").cast("string").alias("user_id"),
                               field(F.col("v"), "sent_ms").cast("long").alias("sent_ms"),
                               field(F.col("v"), "warmup").cast("boolean").alias("warmup")).groupBy("user_id").agg(
            F.count(F.lit(1)).alias("count"), F.max("sent_ms").alias("sent_ms"), F.max_by("warmup", "sent_ms").alias("warmup"))
        return (write_stream(counts.select(F.lit("floor.keyed").alias("topic"),
                                           F.to_json(F.struct("user_id", "count", "sent_ms", "warmup")).alias("value")),
                             bootstrap)
                .outputMode("update").option("checkpointLocation", str(work / f"floor-keyed-{name}"))
                .trigger(processingTime="500 milliseconds").start())

    try:
        query = stateless_floor("alone")
        out["stateless"] = measure(bootstrap, ["floor.stateless"], args)["floor.stateless"].figures("record")
        query.stop()
        query = keyed_floor("alone")
        out["keyed"] = measure(bootstrap, ["floor.keyed"], args)["floor.keyed"].figures("record")
        query.stop()
        # Both floors at once in one application, as the job runs its two lanes: the
        # floor of the two-query design on these cores, each query doing less than ours.
        queries = [stateless_floor("together"), keyed_floor("together")]
        both = measure(bootstrap, ["floor.stateless", "floor.keyed"], args)
        out["stateless_together"] = both["floor.stateless"].figures("record")
        out["keyed_together"] = both["floor.keyed"].figures("record")
        for q in queries:
            q.stop()
    finally:
        spark.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=int, default=5_000)
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--users", type=int, default=2_000)
    ap.add_argument("--rules", default="62,300,1000", help="rule counts in force, ascending, the first >= 62")
    args = ap.parse_args()
    counts = [int(x) for x in args.rules.split(",")]
    work = Path(tempfile.mkdtemp(prefix="bench-lanes-"))
    rows = []
    with EmbeddedBroker(port=free_port()) as broker:
        bs = broker.bootstrap
        create_topics(bs, ["events.raw", "context.raw", "events.processed"])
        floor = floors(bs, work, args)
        print(f"stateless floor: {floor['stateless']}; keyed floor: {floor['keyed']}; together: "
              f"stateless {floor['stateless_together']}, keyed {floor['keyed_together']}", flush=True)
        rules_dir = work / "rules"
        rules_dir.mkdir()
        make_rules(rules_dir)
        publish_rules([parse_rule(r) for r in yaml.safe_load((rules_dir / "bench.yaml").read_text())], bs)
        published = 0
        job = None
        for n in counts:
            rare = n - BENCH_RULES
            publish_rules([parse_rule(r) for r in rare_rules(rare)[published:]], bs)
            published = rare
            job = DetectJob(bs, work / f"job-{n}",
                            extra_args=("--threshold-lane", "real-time", "--starting-offsets", "latest"))
            job.start(timeout=300)
            # Warm windows (warmup.py) fill from the floors' events first; a velocity rule
            # judges from the batch after its window is in, so the measurement waits for that.
            job.wait_for(lambda s: all(w.get("state") != "loading" for w in (s.get("warm_windows") or {}).values()),
                         timeout=900)
            batches: dict[int, dict] = {}
            sampling = threading.Event()
            sampler = threading.Thread(target=sample_batches, args=(job, sampling, batches), daemon=True)
            sampler.start()
            lat = measure(bs, ["events.processed"], args, rare=rare)["events.processed"]
            sampling.set()
            sampler.join()
            job.stop()
            threshold, velocity = lat.figures("threshold"), lat.figures("velocity")
            row = {"rules": n, "threshold": threshold, "velocity": velocity,
                   "threshold_p99_over_floor": round(threshold["p99_s"] / floor["stateless"]["p99_s"], 2),
                   "velocity_p99_over_floor": round(velocity["p99_s"] / floor["keyed"]["p99_s"], 2),
                   "threshold_p99_over_together": round(threshold["p99_s"] / floor["stateless_together"]["p99_s"], 2),
                   "velocity_p99_over_together": round(velocity["p99_s"] / floor["keyed_together"]["p99_s"], 2),
                   "keyed_batches": print_batches(batches)}
            print(f"{n} rules: threshold lane {threshold} ({row['threshold_p99_over_floor']}x its floor's p99); "
                  f"velocity {velocity} ({row['velocity_p99_over_floor']}x); against the floors run together: "
                  f"{row['threshold_p99_over_together']}x, {row['velocity_p99_over_together']}x", flush=True)
            rows.append(row)
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}; "
          f"{args.rate} events/s for {args.seconds} s after {args.warmup} s of warm-up")
    for row in rows:
        append_result("lanes", {
            "stateless_floor_p99_s": floor["stateless"]["p99_s"], "keyed_floor_p99_s": floor["keyed"]["p99_s"],
            "threshold_p50_s": row["threshold"]["p50_s"], "threshold_p99_s": row["threshold"]["p99_s"],
            "velocity_p50_s": row["velocity"]["p50_s"], "velocity_p99_s": row["velocity"]["p99_s"],
            "threshold_p99_over_floor": row["threshold_p99_over_floor"],
            "velocity_p99_over_floor": row["velocity_p99_over_floor"],
            "stateless_together_p99_s": floor["stateless_together"]["p99_s"],
            "keyed_together_p99_s": floor["keyed_together"]["p99_s"],
            "threshold_p99_over_together": row["threshold_p99_over_together"],
            "velocity_p99_over_together": row["velocity_p99_over_together"],
            **row["keyed_batches"],
        }, rate=args.rate, seconds=args.seconds, warmup_s=args.warmup, rules=row["rules"],
           lane_fetch_wait_ms=int(LANE_FETCH["kafka.fetch.max.wait.ms"]))


if __name__ == "__main__":
    main()
