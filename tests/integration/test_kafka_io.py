"""Kafka I/O against a real broker (tansu over TCP) and a real local Spark session.

Each test uses its own topics on the session's broker, so tests do not see each other's
records. What is held here is exactness: every produced record read once, in the
Kafka schema, across restarts, micro-batch limits and topics added at run time.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterable
from pathlib import Path

import pytest
from confluent_kafka import Producer

from spark_jobs import cli
from spark_jobs.kafka import admin
from spark_jobs.kafka.datasource import (
    KAFKA_SCHEMA,
    KafkaInputPartition,
    fair_limit,
    read_batch,
    read_stream,
    split_ranges,
    write_batch,
    write_stream,
)
from spark_jobs.kafka.publisher import current_rules, publish_rules
from spark_jobs.rules.model import parse_rule

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

Record = tuple[int, bytes | None, bytes]  # partition, key, value


def new_topic(bootstrap: str, prefix: str, partitions: int = 2) -> str:
    name = f"{prefix}.{uuid.uuid4().hex[:8]}"
    admin.create_topics(bootstrap, {name: admin.TopicSpec(partitions=partitions)})
    return name


def produce(bootstrap: str, topic: str, records: Iterable[Record], headers: list | None = None) -> int:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    errors: list[str] = []
    n = 0
    for partition, key, value in records:
        producer.produce(
            topic,
            key=key,
            value=value,
            partition=partition,
            headers=headers,
            on_delivery=lambda err, msg: errors.append(str(err)) if err else None,
        )
        n += 1
    assert producer.flush(30) == 0
    assert not errors
    return n


def json_records(n: int, start: int = 0, partitions: int = 2) -> list[Record]:
    return [(i % partitions, f"k{i}".encode(), json.dumps({"i": i}).encode()) for i in range(start, start + n)]


def run_available_now(df, checkpoint: Path, sink: str = "memory", name: str | None = None, path: Path | None = None):
    """Run a query with trigger(availableNow) to completion; returns the finished query."""
    writer = df.writeStream.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True)
    if sink == "memory":
        writer = writer.format("memory").queryName(name)
    else:
        writer = writer.format(sink).option("path", str(path))
    query = writer.start()
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return query


# ----------------------------------------------------------------------------- reading


def test_batch_read_returns_exactly_the_produced_records(spark, kafka_broker):
    bs = kafka_broker.bootstrap
    topic = new_topic(bs, "t.batch")
    records = json_records(400)
    records.append((0, None, b"\xff\xfe not utf-8"))  # bad input must come through as bytes
    produce(bs, topic, records)

    df = read_batch(spark, bs, topic)
    assert df.schema == KAFKA_SCHEMA
    rows = df.collect()

    assert len(rows) == len(records)
    got = sorted(((r.partition, r.key, r.value) for r in rows), key=repr)
    assert got == sorted(records, key=repr)
    assert {(r.partition, r.offset) for r in rows} == {(0, o) for o in range(201)} | {(1, o) for o in range(200)}
    assert all(r.topic == topic and r.timestampType == 0 and r.timestamp is not None for r in rows)


def test_batch_read_offset_ranges_and_headers(spark, kafka_broker):
    bs = kafka_broker.bootstrap
    topic = new_topic(bs, "t.range")
    produce(bs, topic, json_records(100), headers=[("source", b"test")])

    ranged = read_batch(
        spark, bs, topic, starting_offsets={topic: {"0": 10, "1": -2}}, ending_offsets={topic: {"0": 20, "1": -1}}
    )
    offsets = sorted((r.partition, r.offset) for r in ranged.select("partition", "offset").collect())
    assert offsets == [(0, o) for o in range(10, 20)] + [(1, o) for o in range(50)]

    with_headers = read_batch(spark, bs, topic, options={"includeHeaders": "true"}).collect()
    assert len(with_headers) == 100
    assert all([(h.key, h.value) for h in r.headers] == [("source", b"test")] for r in with_headers)


def test_streaming_restart_on_checkpoint_reads_every_record_exactly_once(spark, kafka_broker, tmp_path):
    bs = kafka_broker.bootstrap
    topic = new_topic(bs, "t.stream")
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    first = json_records(300)
    produce(bs, topic, first)

    run_available_now(read_stream(spark, bs, topic), ckpt, sink="parquet", path=out)
    assert spark.read.parquet(str(out)).count() == 300

    second = json_records(200, start=300)
    produce(bs, topic, second)
    run_available_now(read_stream(spark, bs, topic), ckpt, sink="parquet", path=out)

    rows = spark.read.parquet(str(out)).select("partition", "offset", "value").collect()
    assert len(rows) == 500
    assert len({(r.partition, r.offset) for r in rows}) == 500
    assert sorted(r.value for r in rows) == sorted(v for _, _, v in first + second)


def test_max_offsets_per_trigger_limits_each_micro_batch(spark, kafka_broker, tmp_path):
    bs = kafka_broker.bootstrap
    topic = new_topic(bs, "t.limit")
    # Skewed on purpose: partition 0 has 700 records, partition 1 has 300.
    produce(bs, topic, [(0 if i < 700 else 1, None, b"x%d" % i) for i in range(1000)])

    query = run_available_now(
        read_stream(spark, bs, topic, max_offsets_per_trigger=250), tmp_path / "ckpt", name="limited"
    )
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [250, 250, 250, 250]
    end = query.recentProgress[0]["sources"][0]["endOffset"]
    first = (json.loads(end) if isinstance(end, str) else end)[topic]
    assert first == {"0": 125, "1": 125}  # shared fairly, not taken from the busy partition only
    assert spark.table("limited").count() == 1000


def test_subscribe_file_picks_up_new_topics_without_restart(spark, kafka_broker, tmp_path):
    bs = kafka_broker.bootstrap
    a = new_topic(bs, "t.sf.a")
    later = f"t.sf.later.{uuid.uuid4().hex[:8]}"  # listed before it exists: skipped until it does
    topics_file = tmp_path / "topics.json"
    write_json_atomic(topics_file, [a, later])
    produce(bs, a, json_records(50))

    df = read_stream(spark, bs, topics_file=topics_file)
    query = (
        df.writeStream.format("memory")
        .queryName("subscribed")
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        query.processAllAvailable()
        assert spark.table("subscribed").count() == 50

        b = new_topic(bs, "t.sf.b")
        produce(bs, b, json_records(30))
        write_json_atomic(topics_file, [a, later, b])
        admin.create_topics(bs, {later: admin.TopicSpec(partitions=2)})
        produce(bs, later, json_records(20))
        query.processAllAvailable()

        rows = spark.table("subscribed").select("topic", "partition", "offset").collect()
        by_topic = {t: sum(1 for r in rows if r.topic == t) for t in (a, b, later)}
        assert by_topic == {a: 50, b: 30, later: 20}
        assert len({(r.topic, r.partition, r.offset) for r in rows}) == 100
    finally:
        query.stop()


def test_checkpoint_ahead_of_the_broker_is_reported_as_data_loss(spark, kafka_broker, tmp_path):
    """What a memory-only broker restart looks like to a running query: offsets went back."""
    bs = kafka_broker.bootstrap
    topic = new_topic(bs, "t.loss", partitions=1)
    produce(bs, topic, json_records(10, partitions=1))
    ahead = {topic: {"0": 500}}

    strict = read_stream(spark, bs, topic, starting_offsets=ahead)
    query = strict.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "c1")).start()
    with pytest.raises(Exception, match="data loss"):
        query.awaitTermination(60)

    lenient = read_stream(spark, bs, topic, starting_offsets=ahead, options={"failOnDataLoss": "false"})
    run_available_now(lenient, tmp_path / "c2", name="lenient")
    assert spark.table("lenient").count() == 10  # re-read from the start of what is there


def write_json_atomic(path: Path, data: object) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def test_fair_limit_shares_and_never_exceeds():
    begin = {("t", 0): 0, ("t", 1): 0, ("t", 2): 0}
    end = {("t", 0): 1000, ("t", 1): 10, ("t", 2): 1000}
    limited = fair_limit(begin, end, 300)
    assert limited == {("t", 0): 145, ("t", 1): 10, ("t", 2): 145}
    assert fair_limit(begin, end, 5000) == end


def test_min_partitions_splits_ranges_without_gaps_or_overlaps():
    ranges = [KafkaInputPartition("t", 0, 0, 1000), KafkaInputPartition("t", 1, 50, 60)]
    split = split_ranges(ranges, 8)
    assert len(split) >= 8
    covered = sorted((r.partition, o) for r in split for o in range(r.start, r.end))
    assert covered == [(0, o) for o in range(1000)] + [(1, o) for o in range(50, 60)]


# ----------------------------------------------------------------------------- writing


def test_batch_writer_writes_rows_that_read_back(spark, kafka_broker):
    bs = kafka_broker.bootstrap
    topic = new_topic(bs, "t.write")
    rows = [("k1", b'{"a": 1}'), (None, b"\xff raw bytes"), ("k3", b"")]
    df = spark.createDataFrame(rows, "key string, value binary")
    write_batch(df, bs, topic=topic)

    got = sorted(((r.key, r.value) for r in admin.read_all(bs, topic)), key=repr)
    assert got == sorted((((k.encode() if k else None), v) for k, v in rows), key=repr)


def test_batch_writer_routes_by_topic_column(spark, kafka_broker):
    bs = kafka_broker.bootstrap
    t1, t2 = new_topic(bs, "t.route1"), new_topic(bs, "t.route2")
    df = spark.createDataFrame([(t1, "a"), (t2, "b"), (t2, "c")], "topic string, value string")
    write_batch(df, bs)
    assert [r.value for r in admin.read_all(bs, t1)] == [b"a"]
    assert sorted(r.value for r in admin.read_all(bs, t2)) == [b"b", b"c"]


def test_writer_delivery_error_fails_the_write(spark, kafka_broker):
    bs = kafka_broker.bootstrap
    topic = new_topic(bs, "t.fail", partitions=1)
    df = spark.createDataFrame([("v", 7)], "value string, partition int")  # partition 7 does not exist
    with pytest.raises(Exception, match="not delivered|Unknown partition"):
        write_batch(df, bs, topic=topic, options={"kafka.message.timeout.ms": "5000"})


def test_stream_writer_copies_a_topic(spark, kafka_broker, tmp_path):
    bs = kafka_broker.bootstrap
    src, dst = new_topic(bs, "t.src"), new_topic(bs, "t.dst")
    produce(bs, src, json_records(120))

    copied = read_stream(spark, bs, src).selectExpr("key", "value")
    query = (
        write_stream(copied, bs, topic=dst)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    got = sorted((r.key, r.value) for r in admin.read_all(bs, dst))
    assert got == sorted((k, v) for _, k, v in json_records(120))


# ----------------------------------------------------------------------------- publishing rules


def threshold_rule(rule_id: str, version: str = "1", enabled: bool = True):
    return parse_rule(
        {
            "rule_id": rule_id,
            "version": version,
            "rule_type": "threshold",
            "source_topic": "events.raw",
            "enabled": enabled,
            "conditions": [{"field": "amount", "operator": ">=", "value": 100}],
        }
    )


def test_publish_rules_is_idempotent(kafka_broker):
    bs = kafka_broker.bootstrap
    topic = f"rules.test.{uuid.uuid4().hex[:8]}"
    rules = [threshold_rule("big_amount"), threshold_rule("huge_amount")]

    first = publish_rules(rules, bs, topic, published_by="ci", commit="abc123")
    assert first.published == [("big_amount", "1"), ("huge_amount", "1")]
    assert first.unchanged == []

    again = publish_rules(rules, bs, topic)
    assert again.published == []
    assert again.unchanged == [("big_amount", "1"), ("huge_amount", "1")]

    bumped = publish_rules([threshold_rule("big_amount", "2"), rules[1]], bs, topic)
    assert bumped.published == [("big_amount", "2")]
    disabled = publish_rules([threshold_rule("big_amount", "3", enabled=False), rules[1]], bs, topic)
    assert disabled.published == [("big_amount", "3")]

    live = current_rules(bs, topic)
    assert live["big_amount"]["version"] == "3" and live["big_amount"]["enabled"] is False
    assert live["huge_amount"]["version"] == "1"
    records = admin.read_all(bs, topic)
    assert len(records) == 4  # 2 + 0 + 1 + 1: nothing republished
    assert records[0].header("published_by") == b"ci" and records[0].header("commit") == b"abc123"


RULE_YAML = """\
rule_id: cli_rule
version: "{version}"
rule_type: threshold
source_topic: events.raw
conditions:
  - {{field: amount, operator: ">=", value: 10}}
"""


def test_rulectl_publish_cli(kafka_broker, tmp_path, capsys):
    bs = kafka_broker.bootstrap
    topic = f"rules.cli.{uuid.uuid4().hex[:8]}"
    good = tmp_path / "good"
    good.mkdir()
    (good / "cli_rule.yaml").write_text(RULE_YAML.format(version="1"))
    argv = ["publish", "--rules", str(good), "--bootstrap", bs, "--topic", topic]

    assert cli.main(argv) == 0
    assert "published cli_rule version 1" in capsys.readouterr().out
    assert cli.main([*argv, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["unchanged"] == [{"rule_id": "cli_rule", "version": "1"}]

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "broken.yaml").write_text(RULE_YAML.format(version="1").replace('operator: ">="', 'operator: "=~"'))
    assert cli.main(["publish", "--rules", str(bad), "--bootstrap", bs, "--topic", topic]) == 1
    out = capsys.readouterr().out
    assert "broken.yaml" in out and "conditions[0].operator" in out
    assert len(admin.read_all(bs, topic)) == 1  # the invalid set published nothing
