"""The job's rule registry following `rules.active` on a real broker: a published release
is read whole, written to the snapshot and announced to the job (`on_change`) as soon as
the broker has it, so the job publishes the next batch's version without waiting for
its own poll; a record that changes nothing is not announced."""

from __future__ import annotations

import json
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

from spark_jobs.kafka import admin
from spark_jobs.kafka.publisher import publish_rules
from spark_jobs.rules.model import parse_rule
from spark_jobs.streaming.registry import RuleProblem, RuleRegistry

pytestmark = pytest.mark.kafka


def _rule(rule_id: str, version: str, floor: int) -> dict:
    return {"rule_id": rule_id, "version": version, "rule_type": "threshold", "source_topic": "events.raw",
            "conditions": [{"field": "amount", "operator": ">=", "value": floor}]}


def test_the_registry_announces_each_release_it_reads(kafka_broker, tmp_path: Path) -> None:
    bs = kafka_broker.bootstrap
    topic = f"rules.active.{uuid.uuid4().hex[:8]}"
    admin.create_topics(bs, [topic])
    changed = threading.Event()
    problems: list[RuleProblem] = []
    registry = RuleRegistry(bs, tmp_path / "state", topic=topic, on_change=changed.set, on_problem=problems.append)
    registry.start()
    try:
        assert registry.current().rules == {}
        assert not changed.is_set()

        # A release of three rules: announced, and every rule of it in the snapshot.
        publish_rules([parse_rule(_rule(f"r{i}", "1", 100 * i)) for i in range(3)], bs, topic)
        assert changed.wait(30), "the registry did not announce the release"
        changed.clear()
        snapshot = json.loads((tmp_path / "state" / "rules.json").read_text())
        assert {rid: r["version"] for rid, r in snapshot.items()} == {"r0": "1", "r1": "1", "r2": "1"}

        # A record that is no rule changes nothing: reported, not announced ...
        p = Producer({"bootstrap.servers": bs})
        p.produce(topic, key=b"r1", value=b'{"rule_id": "r1", "version": ')
        assert p.flush(30) == 0
        deadline = time.monotonic() + 30
        while not problems and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(problems) == 1 and problems[0].key == "r1"
        assert not changed.is_set()
        # ... and the next release is announced again, with what it changed.
        publish_rules([parse_rule(_rule("r1", "2", 150))], bs, topic)
        assert changed.wait(30), "the registry did not announce the second release"
        rules = registry.current().rules
        assert rules["r1"].version == "2" and rules["r1"].conditions[0].value == 150
        assert rules["r0"].version == "1"
    finally:
        registry.stop()
