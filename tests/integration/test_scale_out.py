"""The detection job on a real Spark standalone cluster (a master, two workers from
`spark-class`) reading a real three-broker Kafka cluster: a worker is SIGKILLed and a
broker is SIGKILLed while velocity windows are open; the job goes on and its detections
are those of the rules over the whole stream (an independent reference evaluator),
duplicates only with equal ids."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cluster_helpers import free_block, wait_until
from confluent_kafka import Producer
from detect_harness import DetectJob, detections, wait_detections
from reference_engine import RefEvent, evaluate

from spark_jobs.kafka.cluster import KafkaCluster
from spark_jobs.kafka.publisher import publish_rules
from spark_jobs.platform.spark_cluster import LocalSparkCluster
from spark_jobs.rules.model import parse_rule

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

# Beyond the stream's whole event-time span (~6 min): while the killed broker's
# partitions fail over, the other partition runs ahead in event time, and with a
# shorter delay the stalled partition's records would come in behind the watermark and
# be dead-lettered as late (by design: bounded out-of-orderness). This test is about
# losing a host and a broker, not about lateness (test_keyed_processor covers that).
WATERMARK_S = 600
RULES = [
    {"rule_id": "burst_per_user", "version": "1", "rule_type": "velocity", "source_topic": "events.raw",
     "group_by": "user", "window_size": 4, "window_unit": "seconds", "aggregation_type": "count", "threshold": 4,
     "emit_mode": "last_event", "time_mode": "event_time", "timestamp_field": "ts", "watermark_delay": WATERMARK_S},
    {"rule_id": "spend_per_user", "version": "1", "rule_type": "velocity", "source_topic": "events.raw",
     "group_by": "user", "window_size": 10, "window_unit": "seconds", "aggregation_type": "sum",
     "aggregation_field": "amount", "threshold": 350, "emit_mode": "all_events", "time_mode": "event_time",
     "timestamp_field": "ts", "watermark_delay": WATERMARK_S},
]
N_EVENTS = 6000
RATE = 150  # events/s offered: the stream lasts ~40 s, the kills fall inside it


def _events(seed: int = 12) -> list[str]:
    """In event-time order per key (and globally): live and reference must agree."""
    rng = random.Random(seed)
    t = datetime(2026, 3, 1, tzinfo=UTC)
    out = []
    for i in range(N_EVENTS):
        t += timedelta(milliseconds=rng.randint(1, 120))
        out.append(json.dumps({"eid": i, "user": f"u{rng.randint(0, 29)}", "amount": rng.randint(1, 100),
                               "ts": t.isoformat().replace("+00:00", "Z")}))
    return out


@pytest.fixture(scope="module")
def clusters(tmp_path_factory):
    work = tmp_path_factory.mktemp("scale-out")
    kport = free_block(3)
    spark_port = free_block(1, kport + 1000)
    ui_port = free_block(3, spark_port + 100)
    kafka = KafkaCluster(work / "kafka", port=kport, controller_port=kport + 500,
                         partitions={"events.raw": 2, "events.processed": 2})
    spark = LocalSparkCluster(work / "spark", workers=2, port=spark_port, webui_port=ui_port)
    try:
        kafka.start()
        spark.start()
        yield kafka, spark, work
    finally:
        spark.stop()
        kafka.stop()


def test_job_survives_a_lost_worker_and_a_lost_broker(clusters) -> None:
    kafka, spark, work = clusters
    publish_rules([parse_rule(r) for r in RULES], kafka.bootstrap)
    job = DetectJob(kafka.bootstrap, work / "detect", extra_args=("--master", spark.master_url))
    job.start(timeout=240)
    try:
        apps = spark.state()["activeapps"]
        assert [a["name"] for a in apps] == ["detection-job"]
        assert apps[0]["cores"] == 2  # one core of each worker

        events = _events()
        sent: list[int] = []
        errors: list[str] = []

        def produce() -> None:
            p = Producer({"bootstrap.servers": kafka.bootstrap, "acks": "all", "enable.idempotence": True,
                          "linger.ms": 5})
            for i, v in enumerate(events):
                user = json.loads(v)["user"]
                p.produce("events.raw", key=user.encode(), value=v.encode(),
                          on_delivery=lambda err, _m, n=i: errors.append(str(err)) if err else sent.append(n))
                p.poll(0)
                time.sleep(1 / RATE)
            assert p.flush(120) == 0

        t = threading.Thread(target=produce)
        t.start()
        wait_until(lambda: len(sent) > N_EVENTS // 4, 120, "a quarter of the stream")
        batch = job.status().get("last_batch_id") or 0
        spark.kill_worker(1)  # windows of every user are open: a lost host
        wait_until(lambda: len(sent) > N_EVENTS // 2, 120, "half of the stream")
        leader = _leader(kafka, "events.raw")
        os.kill(kafka.node(leader).pid, signal.SIGKILL)  # a lost broker, mid-stream
        t.join(240)
        assert not errors, errors[:3]
        assert len(sent) == N_EVENTS
        # The job goes on: more batches, every record read, the process still alive.
        job.wait_for(lambda s: (s.get("last_batch_id") or 0) > batch + 3 and s.get("lag") == 0, 300)
        assert job.proc is not None and job.proc.poll() is None
        # The status's lag is as of its batch's start (the source's latest offsets then):
        # a batch that began before the last records were acknowledged says 0 with
        # them still to read. So wait for the detections themselves; a job that lost
        # some never gets there, and the assertions below show which.
        refs = evaluate([parse_rule(r) for r in RULES],
                        [RefEvent("events.raw", v, i) for i, v in enumerate(events)])
        expected = {(d.rule_id, json.loads(d.raw)["eid"]): d.aggregation_value for d in refs}
        with contextlib.suppress(TimeoutError):
            wait_detections(kafka.bootstrap, "events.processed",
                            lambda d: {(x["rule_id"], x["eid"]) for x in d} >= expected.keys(), timeout=120)
        time.sleep(5)  # nothing more may come
        job.wait_for(lambda s: s.get("lag") == 0, 120)
        live = detections(kafka.bootstrap)
    finally:
        if job.proc and job.proc.poll() is None:
            assert job.stop() == 0, job.tail_log()

    got: dict[tuple[str, int], set[str]] = {}
    values: dict[tuple[str, int], float] = {}
    for d in live:
        k = (d["rule_id"], d["eid"])
        got.setdefault(k, set()).add(d["detection_id"])
        values[k] = d["aggregation_value"]
    assert len(expected) > 100
    assert set(got) == set(expected)
    assert all(len(ids) == 1 for ids in got.values()), "a duplicate detection with another id"
    assert all(values[k] == pytest.approx(v) for k, v in expected.items())


def _leader(kafka: KafkaCluster, topic: str) -> int:
    from confluent_kafka.admin import AdminClient

    md = AdminClient({"bootstrap.servers": kafka.bootstrap}).list_topics(topic, timeout=10)
    return md.topics[topic].partitions[0].leader


def test_cluster_command_lines_are_the_documented_ones(clusters) -> None:
    """What runs is `spark-class <Master|Worker> ...` (docker/ runs the same lines)."""
    _, spark, _ = clusters
    assert spark.master.argv[:2] == ["spark-class", "org.apache.spark.deploy.master.Master"]
    assert all(w.argv[:2] == ["spark-class", "org.apache.spark.deploy.worker.Worker"] for w in spark.workers)
    assert Path(spark.work_dir / "master.log").exists()
