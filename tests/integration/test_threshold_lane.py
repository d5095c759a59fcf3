"""The real-time lane (`rulectl detect --threshold-lane real-time`) on a real broker over
TCP and a real Spark: threshold detections come from a query of their own in Spark's
real-time mode, once each, with the sink contract's ids; a threshold rule change reaches
it without restarting it; the keyed rules go on in the micro-batch query beside it; the
lane dead-letters records that are no event and counts the values its rules cannot read."""

from __future__ import annotations

import hashlib
import json
import time

import pytest
from detect_harness import DetectJob, detections, produce, wait_detections

from spark_jobs.kafka.admin import create_topics
from spark_jobs.kafka.broker import EmbeddedBroker, free_port
from spark_jobs.kafka.publisher import publish_rules
from spark_jobs.rules.model import parse_rule

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

TOPIC = "payments.rt"
BIG = {"rule_id": "big_payment", "version": "1", "rule_type": "threshold", "source_topic": TOPIC,
       "name": "Big payment", "conditions": [{"field": "amount", "operator": ">", "value": 10}]}
BURST = {"rule_id": "payment_burst", "version": "1", "rule_type": "velocity", "source_topic": TOPIC,
         "group_by": "user", "window_size": 60, "window_unit": "seconds", "aggregation_type": "count",
         "threshold": 3, "time_mode": "event_time", "timestamp_field": "ts"}


def _detection_id(rule_id: str, version: str, topic: str, raw: str) -> str:
    """The sink contract's id (docs/rule-language.md): the first 32 hex digits of the
    SHA-256 of rule id, version, topic and event text, separated by U+001F."""
    return hashlib.sha256("\u001f".join([rule_id, version, topic, raw]).encode()).hexdigest()[:32]


@pytest.fixture()
def lane_job(tmp_path):
    broker = EmbeddedBroker(port=free_port(), data_dir=tmp_path / "kafka").start()
    create_topics(broker.bootstrap, [TOPIC])
    publish_rules([parse_rule(BIG), parse_rule(BURST)], broker.bootstrap)
    job = DetectJob(broker.bootstrap, tmp_path / "job", extra_args=("--threshold-lane", "real-time"))
    yield broker, job
    if job.proc and job.proc.poll() is None:
        assert job.stop() == 0, job.tail_log()
    broker.stop()


def test_threshold_rules_run_in_the_real_time_lane_and_change_without_a_restart(lane_job):
    broker, job = lane_job
    bs = broker.bootstrap
    first = job.start()
    assert first["threshold_lane"]["mode"] == "real-time"
    now = int(time.time())
    pay = lambda tag, amount, user="u1", dt=0: json.dumps(  # noqa: E731
        {"pay": tag, "user": user, "amount": amount, "ts": now + dt})
    p1 = pay("p1", 50)
    burst = [pay(f"b{i}", 1, user="u9", dt=i) for i in range(3)]
    produce(bs, TOPIC, [p1, *burst])
    wait_detections(bs, "events.processed", lambda d: any(x.get("pay") == "p1" for x in d)
                    and any(x.get("rule_id") == "payment_burst" for x in d))

    stricter = {**BIG, "version": "2", "conditions": [{"field": "amount", "operator": ">", "value": 100}]}
    publish_rules([parse_rule(stricter)], bs)
    job.wait_for(lambda s: s["rule_versions"].get("big_payment") == "2")
    p2, p3 = pay("p2", 50), pay("p3", 500)
    # A record that is no event, and an event whose amount the rules cannot read.
    broken, unread = '{"pay": "x1", "amount": 5', json.dumps({"pay": "u1", "user": "u2", "amount": "lots", "ts": now})
    produce(bs, TOPIC, [p2, p3, broken, unread])
    # p3's threshold detection comes from the lane and its burst from the keyed query; a
    # status that says lag 0 may predate the records just produced, so wait for both.
    wait_detections(bs, "events.processed", lambda d: any(x.get("pay") == "p3" for x in d)
                    and any(x.get("pay") == "p3" and x.get("rule_id") == "payment_burst" for x in d))
    job.wait_for(lambda s: s.get("lag") == 0 and s["threshold_lane"].get("lag") == 0)
    time.sleep(3)

    got = detections(bs)
    threshold = sorted((d["pay"], d["rule_version"], d["rule_name"], d["detection_id"])
                       for d in got if d["rule_type"] == "threshold")
    # Once each (the keyed query judges no threshold rule), by the version in force.
    assert threshold == [("p1", "1", "Big payment", _detection_id("big_payment", "1", TOPIC, p1)),
                         ("p3", "2", "Big payment", _detection_id("big_payment", "2", TOPIC, p3))]
    # The third event of a user in 60 s: b2 (u9), and p3 (u1's p1, p2, p3).
    bursts = sorted((d["pay"], d["detection_id"]) for d in got if d["rule_id"] == "payment_burst")
    assert bursts == [("b2", _detection_id("payment_burst", "1", TOPIC, burst[2])),
                      ("p3", _detection_id("payment_burst", "1", TOPIC, p3))]
    status = job.status()
    assert status["threshold_lane"]["run_id"] == first["threshold_lane"]["run_id"]
    assert status["threshold_lane"]["failures"] == 0
    assert status["run_id"] == first["run_id"]
    # The lane dead-letters the record that is no event, once (the keyed query not again),
    # and counts the value its rule could not read in the job's status.
    dead = detections(bs, "events.deadletter")
    assert [(d["raw"], d["topic"]) for d in dead] == [(broken, TOPIC)], dead
    assert dead[0]["reason"] == "not valid JSON"
    job.wait_for(lambda s: s["unreadable"].get("big_payment") == {"value at $['amount'] is not a number": 1})

