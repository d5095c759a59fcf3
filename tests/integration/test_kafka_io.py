"""Kafka I/O against a real Apache Kafka broker over TCP and a real local Spark session
through Spark's own connector (`spark-sql-kafka-0-10`, jars from Maven Central).

Each test uses its own topics on the session's broker, so tests do not see each other's
records. What is held here is what the platform relies on from the connector with its
options (`spark_jobs.kafka.spark_io`): every produced record read once across restarts,
a log that went back reported as data loss, rows routed by their topic column, and the
platform's topic configs on the broker.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from pathlib import Path

import pytest
from confluent_kafka import Producer

from spark_jobs import cli
from spark_jobs.kafka import admin
from spark_jobs.kafka.broker import DEFAULT_TOPICS
from spark_jobs.kafka.publisher import current_rules, publish_rules
from spark_jobs.kafka.spark_io import read_batch, read_stream, write_stream
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

    rows = read_batch(spark, bs, [topic]).collect()

    assert len(rows) == len(records)
    got = sorted(((r.partition, r.key, r.value) for r in rows), key=repr)
    assert got == sorted(records, key=repr)
    assert {(r.partition, r.offset) for r in rows} == {(0, o) for o in range(201)} | {(1, o) for o in range(200)}
    assert all(r.topic == topic and r.timestamp is not None for r in rows)


def test_streaming_restart_on_checkpoint_reads_every_record_exactly_once(spark, kafka_broker, tmp_path):
    bs = kafka_broker.bootstrap
    topic = new_topic(bs, "t.stream")
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    first = json_records(300)
    produce(bs, topic, first)

    run_available_now(read_stream(spark, bs, [topic]), ckpt, sink="parquet", path=out)
    assert spark.read.parquet(str(out)).count() == 300

    second = json_records(200, start=300)
    produce(bs, topic, second)
    run_available_now(read_stream(spark, bs, [topic]), ckpt, sink="parquet", path=out)

    rows = spark.read.parquet(str(out)).select("partition", "offset", "value").collect()
    assert len(rows) == 500
    assert len({(r.partition, r.offset) for r in rows}) == 500
    assert sorted(r.value for r in rows) == sorted(v for _, _, v in first + second)


def test_a_log_that_went_back_stops_the_query_with_data_loss(spark, kafka_broker, tmp_path):
    """What a broker that lost its log looks like to a query: the checkpoint's offsets
    are ahead of the topic. The platform's reader options refuse to skip silently."""
    bs = kafka_broker.bootstrap
    topic = new_topic(bs, "t.loss", partitions=1)
    produce(bs, topic, json_records(10, partitions=1))
    ckpt = tmp_path / "ckpt"
    run_available_now(read_stream(spark, bs, [topic]), ckpt, name="loss_before")
    assert spark.table("loss_before").count() == 10

    recreate(bs, topic)
    produce(bs, topic, json_records(3, partitions=1))
    query = read_stream(spark, bs, [topic]).writeStream.format("noop").option(
        "checkpointLocation", str(ckpt)).trigger(availableNow=True).start()
    with pytest.raises(Exception, match="(?i)data (may have been|loss|was lost)|offset was changed"):
        query.awaitTermination(120)


def recreate(bootstrap: str, topic: str) -> None:
    """Delete a topic and create it empty again (its offsets restart at 0)."""
    client = admin.admin_client(bootstrap)
    client.delete_topics([topic])[topic].result(30)
    for _ in range(100):
        try:
            admin.create_topics(bootstrap, {topic: admin.TopicSpec(partitions=1)})
            return
        except RuntimeError:  # deletion still in progress
            import time

            time.sleep(0.2)
    raise AssertionError(f"could not recreate {topic}")


# ----------------------------------------------------------------------------- writing


def test_stream_writer_routes_rows_by_their_topic_column(spark, kafka_broker, tmp_path):
    bs = kafka_broker.bootstrap
    src, even, odd = new_topic(bs, "t.src"), new_topic(bs, "t.even"), new_topic(bs, "t.odd")
    produce(bs, src, json_records(120))

    routed = read_stream(spark, bs, [src]).selectExpr(
        f"CASE WHEN get_json_object(CAST(value AS STRING), '$.i') % 2 = 0 THEN '{even}' ELSE '{odd}' END AS topic",
        "key", "value",
    )
    query = (
        write_stream(routed, bs)
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    got_even = sorted((r.key, r.value) for r in admin.read_all(bs, even))
    got_odd = sorted((r.key, r.value) for r in admin.read_all(bs, odd))
    expected = [(k, v) for _, k, v in json_records(120)]
    assert got_even == sorted(kv for kv in expected if json.loads(kv[1])["i"] % 2 == 0)
    assert got_odd == sorted(kv for kv in expected if json.loads(kv[1])["i"] % 2 == 1)


# ----------------------------------------------------------------------------- the broker


def test_platform_topics_have_their_configs(kafka_broker):
    from confluent_kafka.admin import ConfigResource

    client = admin.admin_client(kafka_broker.bootstrap)
    resources = [ConfigResource(ConfigResource.Type.TOPIC, t) for t in DEFAULT_TOPICS]
    configs = {r.name: {k: v.value for k, v in f.result(30).items()}
               for r, f in client.describe_configs(resources).items()}
    assert configs["rules.active"]["cleanup.policy"] == "compact"
    assert configs["detect.status"]["cleanup.policy"] == "compact"
    assert configs["events.raw"]["cleanup.policy"] == "delete"
    assert int(configs["events.raw"]["retention.ms"]) == 7 * 24 * 3600 * 1000
    assert int(configs["events.deadletter"]["retention.ms"]) == 30 * 24 * 3600 * 1000


def test_broker_keeps_topics_and_records_across_a_restart(tmp_path):
    """The embedded broker's log lives in its data folder: a restart loses nothing."""
    from spark_jobs.kafka.broker import EmbeddedBroker, free_port

    data = tmp_path / "kafka"
    broker = EmbeddedBroker(port=free_port(), data_dir=data, topics=["rules.active"]).start()
    try:
        produce(broker.bootstrap, "rules.active", [(0, b"r1", b'{"v": 1}'), (0, b"r2", b'{"v": 2}')])
    finally:
        broker.stop()
    assert not broker.is_running()
    again = EmbeddedBroker(port=broker.port, data_dir=data, topics=["rules.active"]).start()
    try:
        got = [(r.key, r.value) for r in admin.read_all(again.bootstrap, "rules.active")]
    finally:
        again.stop()
    assert got == [(b"r1", b'{"v": 1}'), (b"r2", b'{"v": 2}')]


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
