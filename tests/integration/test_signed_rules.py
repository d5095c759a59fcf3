"""Issue 13 item 6 (part): rule records signed by the release path, checked by the job.

On a real broker: the publisher signs with the key it shares with the job; a record
written by any other producer (no signature, or one made with another key) reaches the
topic, since the broker here does not stop it, and the job's registry reports it and
ignores it, keeping the rules it had."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

from spark_jobs.kafka import signing
from spark_jobs.kafka.publisher import publish_rules
from spark_jobs.rules.model import parse_rule
from spark_jobs.streaming.registry import RuleProblem, RuleRegistry

pytestmark = pytest.mark.kafka

RULE = {"rule_id": "big_purchase", "version": "1", "rule_type": "threshold", "source_topic": "events.raw",
        "conditions": [{"field": "value", "operator": ">=", "value": 500}]}


def _produce(bootstrap: str, topic: str, value: dict, headers: list[tuple[str, bytes]] | None = None) -> None:
    p = Producer({"bootstrap.servers": bootstrap})
    p.produce(topic, key=value["rule_id"].encode(), value=json.dumps(value).encode(), headers=headers or [])
    assert p.flush(30) == 0


def test_the_job_refuses_rule_records_the_release_path_did_not_sign(
    kafka_broker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bs = kafka_broker.bootstrap
    topic = f"rules.active.{uuid.uuid4().hex[:8]}"
    key_file = signing.ensure_key_file(tmp_path / "rules-signing.key")
    assert key_file.stat().st_mode & 0o777 == 0o600
    monkeypatch.setenv(signing.KEY_FILE_ENV, str(key_file))

    publish_rules([parse_rule(RULE)], bs, topic, published_by="release", commit="c" * 40)
    reported: list[RuleProblem] = []
    registry = RuleRegistry(bs, tmp_path / "state", topic=topic, on_problem=reported.append)
    registry.refresh()
    assert registry.current().rules["big_purchase"].version == "1"

    # A producer without the key: a valid-looking newer version, unsigned ...
    _produce(bs, topic, {**RULE, "version": "2", "conditions": [{"field": "value", "operator": ">=", "value": 1}]})
    # ... and one signed with a key of its own.
    forged = {**RULE, "version": "3", "enabled": False}
    bad_sig = signing.sign(b"not-the-key", b"big_purchase", json.dumps(forged).encode())
    _produce(bs, topic, forged, [(signing.HEADER, bad_sig.encode())])
    registry.refresh()
    rule = registry.current().rules["big_purchase"]
    assert rule.version == "1" and rule.conditions[0].value == 500  # kept what it had
    reasons = [p.reason for p in reported]
    assert len(reasons) == 2
    assert reasons[0].startswith("unsigned rule record refused") and reasons[1].startswith("forged rule record refused")
    snapshot = json.loads((tmp_path / "state" / "rules.json").read_text())
    assert snapshot["big_purchase"]["version"] == "1"

    # The release path's next version is applied.
    publish_rules([parse_rule({**RULE, "version": "4"})], bs, topic, published_by="release", commit="d" * 40)
    registry.refresh()
    assert registry.current().rules["big_purchase"].version == "4"
    registry.stop()

    # Without the key the unsigned version 2 would have gone through: that is what the check stops.
    monkeypatch.delenv(signing.KEY_FILE_ENV)
    naive_topic = f"rules.active.{uuid.uuid4().hex[:8]}"
    from spark_jobs.kafka import admin

    admin.create_topics(bs, [naive_topic])
    _produce(bs, naive_topic, {**RULE, "version": "2"})
    naive = RuleRegistry(bs, tmp_path / "naive", topic=naive_topic)
    naive.refresh()
    assert naive.current().rules["big_purchase"].version == "2"
    naive.stop()
