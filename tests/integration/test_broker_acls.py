"""Issue 13 item 6 (part): on a real Apache Kafka broker with SASL/SCRAM users and ACLs,
only the publisher's credentials can write `rules.active`; the detection job's cannot,
and a client without credentials cannot even connect."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from spark_jobs.kafka.broker import EmbeddedBroker, free_port
from spark_jobs.kafka.security import BrokerSecurity

pytestmark = pytest.mark.kafka

RULE = {"rule_id": "big_purchase", "version": "9", "rule_type": "threshold", "source_topic": "events.raw",
        "conditions": [{"field": "value", "operator": ">=", "value": 1}]}


@pytest.fixture(scope="module")
def secure_broker():
    security = BrokerSecurity.generate()
    broker = EmbeddedBroker(port=free_port(), topics=("rules.active", "events.raw", "events.processed"),
                            security=security).start()
    yield broker, security
    broker.stop()


def _write(bootstrap: str, conf: dict) -> str | None:
    """Produce one rule record; the error the broker answers, or None when written."""
    errors: list[str] = []
    p = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 8000, "enable.idempotence": False, **conf})
    p.produce("rules.active", key=b"big_purchase", value=json.dumps(RULE).encode(),
              on_delivery=lambda err, msg: errors.append(str(err)) if err else None)
    left = p.flush(15)
    return errors[0] if errors else ("not delivered" if left else None)


def test_only_the_publisher_may_write_rules_active(secure_broker) -> None:
    broker, sec = secure_broker
    # The detection job's principal: authenticated, but not allowed to write the rules.
    err = _write(broker.bootstrap, sec.client_config("detector"))
    assert err is not None and "TOPIC_AUTHORIZATION_FAILED" in err.upper().replace(" ", "_"), err
    # A reader, and a client with a wrong password, neither.
    assert _write(broker.bootstrap, sec.client_config("reader")) is not None
    from spark_jobs.kafka.security import client_config

    assert _write(broker.bootstrap, client_config("publisher", "wrong-password")) is not None
    # A client without credentials does not get in at all (plaintext to a SASL listener).
    assert _write(broker.bootstrap, {}) is not None
    # The publisher writes; the detection job reads what it wrote.
    assert _write(broker.bootstrap, sec.client_config("publisher")) is None
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "detect-acl-test", "enable.auto.commit": False,
                  **sec.client_config("detector")})
    c.assign([TopicPartition("rules.active", 0, 0)])
    got = []
    for _ in range(50):
        msg = c.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == KafkaError._PARTITION_EOF:
                break
            raise KafkaException(msg.error())
        got.append(json.loads(msg.value()))
        break
    c.close()
    assert got and got[0]["version"] == "9"


def test_a_log_formatted_without_users_is_refused_secured(tmp_path) -> None:
    """A log folder formatted plaintext (`--insecure`) does not start secured: it has no
    SCRAM users, and the broker says to use a new folder instead of starting open."""
    from spark_jobs.kafka.broker import BrokerError

    data = tmp_path / "kafka"
    with EmbeddedBroker(port=free_port(), topics=("rules.active",), data_dir=data) as plain:
        assert _write(plain.bootstrap, {}) is None  # open: anyone writes the rules
    security = BrokerSecurity.load_or_generate(tmp_path / "kafka-credentials.json")
    with pytest.raises(BrokerError, match="formatted without SASL users"):
        EmbeddedBroker(port=free_port(), topics=("rules.active",), data_dir=data, security=security).start()
    assert not (data / "scram.users").exists()


def test_airflows_publish_hook_authenticates_with_its_connection(secure_broker, monkeypatch) -> None:
    """The release DAG publishes through RulesTopicHook: the `rules_kafka` connection's
    extra carries the publisher's SASL settings (docker/: the airflow_connections
    secret); with another principal's there, the broker refuses the release."""
    from pathlib import Path

    broker, sec = secure_broker
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "plugins"))
    monkeypatch.delenv("KAFKA_CREDENTIALS_FILE", raising=False)
    monkeypatch.delenv("RULES_SIGNING_KEY_FILE", raising=False)
    from rule_lifecycle.hooks import RulesTopicHook

    rule = {**RULE, "version": "10"}

    def connection(user: str) -> None:
        extra = {"bootstrap.servers": broker.bootstrap, **sec.client_config(user)}
        monkeypatch.setenv("AIRFLOW_CONN_RULES_KAFKA", json.dumps({"conn_type": "kafka", "extra": extra}))

    connection("detector")
    with pytest.raises(Exception, match="(?i)authoriz"):
        RulesTopicHook("rules_kafka").publish([rule], published_by="test")
    connection("publisher")
    hook = RulesTopicHook("rules_kafka")
    assert hook.client_security and hook.client_security["sasl.username"] == "publisher"
    result = hook.publish([rule], published_by="test")
    assert [r.version for r in result.published] == ["10"]
    assert hook.current_rules()["big_purchase"]["version"] == "10"
