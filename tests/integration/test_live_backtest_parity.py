"""Differential test: the live job and the backtest, the same random in-order streams,
identical detections and ids.

The two are separate implementations of the keyed semantics (the live job's Python
keyed operator over micro-batches, the backtest's Spark window plans), so each seed
draws a rule set covering every aggregation, both emit modes and the correlation
resolutions and metrics, and a stream with fractional, large and tiny values and equal
timestamps. The live job reads it through Spark's Kafka connector from a real broker in
small micro-batches (state carried across many batches); the backtest reads the same
records from files. Bucketing and randomness are seeded (no Python `hash()`).
"""

from __future__ import annotations

import json
import random

import pytest
from detect_harness import DetectJob, assert_same_detections, detections, produce, wait_detections

from spark_jobs.backtest.inputs import InputSpec
from spark_jobs.backtest.runner import BacktestConfig, run_backtest
from spark_jobs.kafka.broker import EmbeddedBroker, free_port
from spark_jobs.kafka.publisher import publish_rules
from spark_jobs.rules.model import parse_rule

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]

BASE_S = 1_767_600_000
# Long enough that no in-order record is ever late, whatever batch it lands in.
DELAY_S = 3600
VALUES = [0.1, 0.2, 0.3, 1.5, 2.25, 7, 42.5, -3.5, 1e15, 3e-9, 123456.789, 0]


def _rules(rnd: random.Random) -> list[dict]:
    out = []
    for agg in ("count", "sum", "avg", "min", "max", "distinct_count"):
        threshold = {"count": rnd.choice([2, 3, 4]), "distinct_count": rnd.choice([2, 3]),
                     "sum": rnd.choice([5, 50, 1e15]), "avg": rnd.choice([1, 10]),
                     "min": rnd.choice([-1, 0.2]), "max": rnd.choice([7, 100])}[agg]
        rule = {"rule_id": f"v_{agg}", "version": "1", "rule_type": "velocity", "source_topic": "events.raw",
                "group_by": "user", "window_size": rnd.choice([3, 5, 20]), "window_unit": "seconds",
                "aggregation_type": agg, "threshold": threshold, "emit_mode": rnd.choice(["last_event", "all_events"]),
                "time_mode": "event_time", "timestamp_field": "ts", "watermark_delay": DELAY_S,
                "conditions": [{"field": "kind", "operator": "==", "value": "ev"}]}
        if agg != "count":
            rule["aggregation_field"] = "x"
        out.append(rule)
    for resolution, metric, op, value in (("last", "ratio_deviation", ">", 0.5), ("mean", "difference", ">", 2),
                                          ("mean_std", "z_score", ">", 1)):
        out.append({"rule_id": f"c_{resolution}", "version": "1", "rule_type": "correlation",
                    "source_topic": "events.raw", "context_topic": "events.raw", "correlation_key": "user",
                    "context_type_field": "kind", "context_type_value": "ctx",
                    "window_size": rnd.choice([5, 30]), "window_unit": "seconds", "context_resolution": resolution,
                    "context_value_field": "rate", "event_value_field": "x", "timestamp_field": "ts",
                    "metric": metric, "condition": {"operator": op, "value": value},
                    "min_context_points": 2 if resolution != "last" else 1, "watermark_delay": DELAY_S})
    return out


def _stream(rnd: random.Random, n: int) -> list[str]:
    """Events and context records on one topic, in event-time order, equal timestamps
    included: one topic, so that arrival order is the same live (offsets) and in the
    backtest (file order); the velocity rules take `kind: ev` only, the correlation
    rules `kind: ctx` as context."""
    out = []
    ms = BASE_S * 1000
    for i in range(n):
        ms += rnd.choice([0, 0, 2, 100, 400, 1000, 3000])  # 0: equal timestamps
        user = f"u{rnd.randrange(4)}"
        if rnd.random() < 0.25:
            out.append(json.dumps({"kind": "ctx", "user": user, "rate": rnd.choice([1.0, 2.0, 2.5, 0.5, 40.0]),
                                   "ts": ms}))
        else:
            out.append(json.dumps({"kind": "ev", "user": user, "x": rnd.choice(VALUES), "i": i, "ts": ms}))
    return out


@pytest.mark.parametrize("seed", [11, 29])
def test_live_and_backtest_give_identical_detections(seed, tmp_path, spark):
    rnd = random.Random(seed)
    rules = _rules(rnd)
    events = _stream(rnd, 700)
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "rules.json").write_text(json.dumps(rules))
    (tmp_path / "events.jsonl").write_text("\n".join(events))
    run_backtest(spark, BacktestConfig(tmp_path / "rules", [InputSpec("events.raw", str(tmp_path / "events.jsonl"))],
                                       tmp_path / "bt", time_field="ts"))
    expected = [json.loads(x) for x in (tmp_path / "bt" / "detections.jsonl").read_text().splitlines()]
    by_rule = {r["rule_id"] for r in expected}
    assert len(by_rule) >= 6, by_rule  # the draw exercises most rules

    with EmbeddedBroker(port=free_port()) as broker:
        bs = broker.bootstrap
        publish_rules([parse_rule(r) for r in rules], bs)
        produce(bs, "events.raw", events)
        # Small micro-batches: each key's window and context live across many batches.
        job = DetectJob(bs, tmp_path / "job", max_offsets_per_trigger=60)
        job.start()
        ids = {d["detection_id"] for d in expected}
        wait_detections(bs, "events.processed", lambda d: ids <= {x["detection_id"] for x in d}, timeout=300)
        status = job.wait_for(lambda s: s.get("lag") == 0, timeout=300)
        assert (status["last_batch_id"] or 0) >= 10
        got = detections(bs)
        assert job.stop() == 0
    assert_same_detections(got, expected)

