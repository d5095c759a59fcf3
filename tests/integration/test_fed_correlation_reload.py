"""A correlation rule fed by a velocity rule (`velocity_filter_rule_id`, the velocity
rule `emit_to_sink: false`) published, disabled and published again while the job runs.

No rule change restarts the query: each is a new rule-set version for the next batch,
and the plan names the same sources and stateful operators whatever the rules (a chain
that came and went with the fed rule, when a change restarted the query, was refused:
"There are [2] sources in the checkpoint offsets and now there are [4] sources
requested by the query"). The velocity emits reach the correlation rule
inside the job: no Kafka topic carries them. The correlation's detections are the
backtest's for the same events and rule versions.
"""

from __future__ import annotations

import json
import time

import pytest
from detect_harness import DetectJob, detections, produce, wait_detections

from spark_jobs.backtest.inputs import InputSpec
from spark_jobs.backtest.runner import BacktestConfig, run_backtest
from spark_jobs.kafka.admin import list_topics
from spark_jobs.kafka.broker import EmbeddedBroker, free_port
from spark_jobs.kafka.publisher import publish_rules
from spark_jobs.rules.model import parse_rule

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

BASE_S = 1_767_600_000
VELOCITY = {
    "rule_id": "tag_burst", "version": "1", "rule_type": "velocity", "source_topic": "events.raw",
    "conditions": [{"field": "type", "operator": "==", "value": "post"}], "group_by": "tag",
    "aggregation_type": "count", "window_size": 30, "window_unit": "seconds", "threshold": 3,
    "emit_mode": "all_events", "time_mode": "event_time", "timestamp_field": "ts", "emit_to_sink": False,
    "watermark_delay": 3600,
}


def _correlation(version: str, enabled: bool = True) -> dict:
    return {
        "rule_id": "burst_low_rep", "version": version, "rule_type": "correlation", "enabled": enabled,
        "source_topic": "events.raw", "velocity_filter_rule_id": "tag_burst", "context_topic": "events.raw",
        "context_type_field": "type", "context_type_value": "rep", "correlation_key": "user",
        "window_size": 1, "window_unit": "days", "context_resolution": "last", "context_value_field": "score",
        "timestamp_field": "ts", "metric": "direct", "condition": {"operator": "<", "value": 0.4},
        "emit_mode": "both", "watermark_delay": 3600,
    }


def _phase(name: str, t0: int) -> list[str]:
    """Reputations, then a burst of posts on one tag by a low- and a high-reputation
    user: keys and times of their own, so phases do not share state."""
    low, high = f"{name}_low", f"{name}_high"
    out = [json.dumps({"type": "rep", "user": low, "score": 0.1, "ts": (t0 + 0) * 1000}),
           json.dumps({"type": "rep", "user": high, "score": 0.9, "ts": (t0 + 0) * 1000})]
    for i in range(5):
        out.append(json.dumps({"type": "post", "tag": f"#{name}", "user": (low, high)[i % 2], "i": i,
                               "ts": (t0 + 1 + i) * 1000}))
    return out


def _backtest(spark, tmp_path, name: str, rules: list[dict], events: list[str]) -> set[str]:
    work = tmp_path / f"bt-{name}"
    (work / "rules").mkdir(parents=True)
    (work / "rules" / "rules.json").write_text(json.dumps(rules))
    (work / "events.jsonl").write_text("\n".join(events))
    run_backtest(spark, BacktestConfig(work / "rules", [InputSpec("events.raw", str(work / "events.jsonl"))],
                                       work / "out", time_field="ts"))
    out = [json.loads(x) for x in (work / "out" / "detections.jsonl").read_text().splitlines()]
    assert not [d for d in out if d["rule_id"] == "tag_burst"]
    return {d["detection_id"] for d in out if d["rule_id"] == "burst_low_rep"}


def test_fed_correlation_published_disabled_republished(tmp_path, spark):
    events = {"a": _phase("a", BASE_S), "b": _phase("b", BASE_S + 100), "c": _phase("c", BASE_S + 200)}
    expected = {
        "a": _backtest(spark, tmp_path, "a", [VELOCITY, _correlation("1")], events["a"]),
        "c": _backtest(spark, tmp_path, "c", [VELOCITY, _correlation("3")], events["c"]),
    }
    assert expected["a"] and expected["c"]

    def fed(dets: list[dict]) -> set[str]:
        return {d["detection_id"] for d in dets if d["rule_id"] == "burst_low_rep"}

    with EmbeddedBroker(port=free_port()) as broker:
        bs = broker.bootstrap
        # At start no correlation rule reads the velocity rule: its emits go nowhere.
        publish_rules([parse_rule(VELOCITY)], bs)
        produce(bs, "events.raw", [json.dumps({"type": "post", "tag": "#warm", "ts": (BASE_S - 50) * 1000})])
        job = DetectJob(bs, tmp_path / "job")
        first = job.start()

        def publish(rule: dict, present: bool) -> None:
            publish_rules([parse_rule(rule)], bs)
            job.wait_for(lambda s: (s["rule_versions"].get("burst_low_rep") == rule["version"]) == present
                         and ("burst_low_rep" in s["rule_versions"]) == present, timeout=120)

        publish(_correlation("1"), present=True)
        produce(bs, "events.raw", events["a"])
        wait_detections(bs, "events.processed", lambda d: expected["a"] <= fed(d), timeout=180)

        publish(_correlation("2", enabled=False), present=False)
        produce(bs, "events.raw", events["b"])
        job.wait_for(lambda s: s.get("lag") == 0, timeout=120)
        job.batches_after(2)

        publish(_correlation("3"), present=True)
        produce(bs, "events.raw", events["c"])
        wait_detections(bs, "events.processed", lambda d: expected["c"] <= fed(d), timeout=180)
        job.wait_for(lambda s: s.get("lag") == 0, timeout=120)
        time.sleep(2)  # nothing more may come

        status = job.status()
        dets = detections(bs)
        topics = list_topics(bs)
        assert job.proc.poll() is None, job.tail_log()
        assert job.stop() == 0, job.tail_log()

    # Three rule changes, each live without a restart of the query.
    assert (status["query_id"], status["run_id"]) == (first["query_id"], first["run_id"]), status
    assert status["batch_failures"] == 0 and status["rule_changes_live"] >= 3, status
    # Exactly the backtest's, the disabled phase's events judged by no correlation rule.
    assert fed(dets) == expected["a"] | expected["c"]
    assert not [d for d in dets if d["rule_id"] == "tag_burst"]
    assert not [t for t in topics if "routed" in t], topics
    # Every batch, whatever the rules in force, had the same source (one reference to
    # the Kafka source: the input is scanned once per batch, the context records of the
    # fed rule carried through the first operator) and the same two stateful operators.
    query = job.checkpoint / "query"
    offsets = [f for f in (query / "offsets").iterdir() if f.name.isdigit()]
    assert len(offsets) >= 4
    assert {len(f.read_text().splitlines()) - 2 for f in offsets} == {1}
    assert sorted(d.name for d in (query / "state").iterdir() if d.name.isdigit()) == ["0", "1"]
