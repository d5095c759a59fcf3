"""The event archive end to end, on a real broker over TCP and real Spark processes:
events produced live reach the Delta table within a minute, a backtest over the table
gives the live detection job's detections (ids included), and a SIGKILL mid-stream
neither loses nor doubles a record."""

from __future__ import annotations

import json
import random
import time
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from archive_harness import ArchiveJob, produce_keyed, wait_rows
from detect_harness import DetectJob, assert_same_detections, detections, wait_detections
from pyspark.sql import functions as F
from test_live_backtest_parity import _rules, _stream

from spark_jobs.backtest.runner import BacktestConfig, HistoryWindow, run_backtest
from spark_jobs.kafka.publisher import publish_rules
from spark_jobs.rules.model import parse_rule

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]


def _name(prefix: str) -> str:
    return f"{prefix}.{uuid.uuid4().hex[:8]}"


@pytest.fixture
def jobs():
    """Jobs a test starts; whatever still runs at the end (a failed assertion) is killed."""
    started: list[DetectJob] = []
    yield started
    for job in started:
        if job.proc is not None and job.proc.poll() is None:
            job.kill()


def test_live_events_reach_the_table_and_its_backtest_equals_the_live_job(kafka_broker, spark, tmp_path, jobs):
    bs = kafka_broker.bootstrap
    topic = _name("arch.events")
    rnd = random.Random(11)
    rules = _rules(rnd)
    for r in rules:
        r["source_topic"] = topic
        if "context_topic" in r:
            r["context_topic"] = topic
    events = _stream(rnd, 300)
    records = [(json.loads(e)["user"], e) for e in events] + [("bad", "not json"), ("bad", '["array"]')]

    archive = ArchiveJob(bs, tmp_path / "a", [topic], time_field="ts")
    jobs.append(archive)
    produce_keyed(bs, topic, [("warm", "warm-up")])  # creates the topic with 2 partitions
    archive.start()
    # Running: the first micro-batch (the JVM's slowest) is done. Then the clock starts.
    wait_rows(spark, archive.table, lambda n: n >= 1, timeout=240)
    records.insert(0, ("warm", "warm-up"))
    produced_at = time.time()
    produce_keyed(bs, topic, records[1:])
    produced_in = time.time() - produced_at
    # Within a minute of being produced (delivery confirmed).
    n, waited = wait_rows(spark, archive.table, lambda n: n >= len(records), timeout=60)
    assert n == len(records), n
    print(f"\narchive: {n} records produced in {produced_in:.1f}s (delivery confirmed), all in the table "
          f"{waited:.1f}s later")
    table = spark.read.format("delta").load(str(archive.table))
    assert {f.name for f in table.schema.fields} >= {"topic", "date", "partition", "offset", "timestamp", "key",
                                                     "value", "v", "ts_ms"}
    assert table.schema["v"].dataType.typeName() == "variant"
    row = table.filter(F.col("value").cast("string") == events[0]).first()
    assert row["ts_ms"] == json.loads(events[0])["ts"] and row["v"] is not None
    assert table.filter(F.col("value").cast("string") == "not json").first()["v"] is None
    assert archive.stop() == 0
    assert archive.status()["state"] == "stopped"

    # The live detection job over the same records, then a backtest over the table.
    rules_topic, sink = _name("arch.rules"), _name("arch.detections")
    publish_rules([parse_rule(r) for r in rules], bs, topic=rules_topic)
    rules_dir = tmp_path / "rules"
    rules_dir.mkdir()
    (rules_dir / "rules.json").write_text(json.dumps(rules))
    now = datetime.now(UTC)
    run_backtest(spark, BacktestConfig(rules_dir, [], tmp_path / "bt", time_field="ts",
                                       history=HistoryWindow(str(archive.table), now - timedelta(hours=1),
                                                             now + timedelta(minutes=1))))
    expected = [json.loads(x) for x in (tmp_path / "bt" / "detections.jsonl").read_text().splitlines()]
    summary = json.loads((tmp_path / "bt" / "summary.json").read_text())
    assert summary["inputs"][topic]["records"] == len(records) and summary["inputs"][topic]["malformed"] == 3
    assert len({d["rule_id"] for d in expected}) >= 4

    job = DetectJob(bs, tmp_path / "job", sink=sink, dlq=_name("arch.dlq"), rules_topic=rules_topic,
                    max_offsets_per_trigger=100)
    jobs.append(job)
    job.start()
    ids = {d["detection_id"] for d in expected}
    wait_detections(bs, sink, lambda d: ids <= {x["detection_id"] for x in d}, timeout=300)
    job.wait_for(lambda s: s.get("lag") == 0, timeout=300)
    got = detections(bs, sink)
    assert job.stop() == 0
    assert_same_detections(got, expected)


def test_sigkill_mid_stream_and_restart_keeps_every_record_exactly_once(kafka_broker, spark, tmp_path, jobs):
    bs = kafka_broker.bootstrap
    topics = [_name("arch.kill"), _name("arch.kill.ctx")]
    first = [(f"k{i % 7}", json.dumps({"i": i, "timestamp": 1_767_600_000_000 + i})) for i in range(800)]
    produce_keyed(bs, topics[0], first)
    produce_keyed(bs, topics[1], first[:200])
    # Small batches, so the kill lands with batches done and records still to come.
    archive = ArchiveJob(bs, tmp_path / "a", topics, trigger_ms=200, max_offsets_per_trigger=250)
    jobs.append(archive)
    archive.start()
    archive.wait_for(lambda s: (s.get("last_batch_id") or 0) >= 1, timeout=180)
    archive.kill()
    n_killed = spark.read.format("delta").load(str(archive.table)).count()
    assert 0 < n_killed < 1000, n_killed
    second = [(f"k{i % 7}", json.dumps({"i": i})) for i in range(800, 1000)]
    produce_keyed(bs, topics[0], second)  # produced while the job is down

    archive.start()
    total = len(first) + 200 + len(second)
    wait_rows(spark, archive.table, lambda n: n >= total, timeout=300)
    time.sleep(5)  # a duplicate written late would show up by now
    assert archive.stop() == 0
    table = spark.read.format("delta").load(str(archive.table))
    assert table.count() == total
    assert table.select("topic", "partition", "offset").distinct().count() == total
    per_topic = {r["topic"]: r["count"] for r in table.groupBy("topic").count().collect()}
    assert per_topic == {topics[0]: 1000, topics[1]: 200}
