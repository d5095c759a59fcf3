"""Differential test: the live job and the backtest, the same random in-order streams,
identical detections and ids.

Both run the same Java for the keyed rules, but through different drivers: the live job
over micro-batches with state carried between them, expiry timers and a watermark; the
backtest over one sorted pass per key. So each seed draws a rule set covering every
aggregation, both emit modes and the correlation resolutions and metrics, and a stream
with fractional, large and tiny values and equal timestamps. The live job reads it
through Spark's Kafka connector from a real broker in small micro-batches; the backtest
reads the same records from files. Bucketing and randomness are seeded (no Python
`hash()`).
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


def _rules(rnd: random.Random, delay_s: float = DELAY_S, last_event_only: bool = False) -> list[dict]:
    out = []
    for agg in ("count", "sum", "avg", "min", "max", "distinct_count"):
        threshold = {"count": rnd.choice([2, 3, 4]), "distinct_count": rnd.choice([2, 3]),
                     "sum": rnd.choice([5, 50, 1e15]), "avg": rnd.choice([1, 10]),
                     "min": rnd.choice([-1, 0.2]), "max": rnd.choice([7, 100])}[agg]
        rule = {"rule_id": f"v_{agg}", "version": "1", "rule_type": "velocity", "source_topic": "events.raw",
                "group_by": "user", "window_size": rnd.choice([3, 5, 20]), "window_unit": "seconds",
                "aggregation_type": agg, "threshold": threshold,
                "emit_mode": "last_event" if last_event_only else rnd.choice(["last_event", "all_events"]),
                "time_mode": "event_time", "timestamp_field": "ts", "watermark_delay": delay_s,
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
                    "min_context_points": 2 if resolution != "last" else 1, "watermark_delay": delay_s})
    return out


def _stream(rnd: random.Random, n: int, steps: tuple[int, ...] = (0, 0, 2, 100, 400, 1000, 3000),
            users: int = 4) -> list[str]:
    """Events and context records on one topic, in event-time order, equal timestamps
    included: one topic, so that arrival order is the same live (offsets) and in the
    backtest (file order); the velocity rules take `kind: ev` only, the correlation
    rules `kind: ctx` as context."""
    out = []
    ms = BASE_S * 1000
    for i in range(n):
        ms += rnd.choice(steps)  # 0: equal timestamps
        user = f"u{rnd.randrange(users)}"
        if rnd.random() < 0.25:
            out.append(json.dumps({"kind": "ctx", "user": user, "rate": rnd.choice([1.0, 2.0, 2.5, 0.5, 40.0]),
                                   "ts": ms}))
        else:
            out.append(json.dumps({"kind": "ev", "user": user, "x": rnd.choice(VALUES), "i": i, "ts": ms}))
    return out


@pytest.mark.parametrize(("seed", "expiring"), [(11, False), (5, True)])
def test_live_and_backtest_give_identical_detections(seed, expiring, tmp_path, spark):
    """`expiring`: a 1 s watermark delay and keys idle for longer than their windows, so
    the live job drops keys' state (expiry) and sees them come back; the backtest keeps
    every key. Both must still agree, `last_event` included (a new episode once the
    window has emptied)."""
    rnd = random.Random(seed)
    rules = _rules(rnd, delay_s=1, last_event_only=True) if expiring else _rules(rnd)
    events = _stream(rnd, 700, steps=(0, 100, 400, 1000, 3000, 8000), users=8) if expiring else _stream(rnd, 700)
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



def test_a_key_back_after_its_state_expired_is_a_new_episode(tmp_path, spark):
    """`last_event` for a key that comes back after the live job dropped its state.

    u1 fires (min 5 >= 1), goes idle while other users move the watermark far past
    its expiry, and the job runs batches in between (so the expiry timer has fired and
    the state is gone); then u1 comes back with another 5. The live job, having
    forgotten u1, fires; the backtest, keeping every key, must fire too (the window had
    emptied: a new episode, README), with the same id. The expected detections are
    written out here, not computed by either engine.
    """
    rule = {"rule_id": "v_min", "version": "1", "rule_type": "velocity", "source_topic": "events.raw",
            "group_by": "user", "window_size": 5, "window_unit": "seconds", "aggregation_type": "min",
            "aggregation_field": "x", "threshold": 1, "emit_mode": "last_event", "time_mode": "event_time",
            "timestamp_field": "ts", "watermark_delay": 1}
    ms = BASE_S * 1000
    first = [json.dumps({"user": "u1", "x": 5, "ts": ms})]
    first += [json.dumps({"user": f"f{i % 3}", "x": 0.5, "ts": ms + 1000 * i}) for i in range(1, 31)]
    middle = [json.dumps({"user": "f1", "x": 0.5, "ts": ms + 30_500})]
    back = [json.dumps({"user": "u1", "x": 5, "ts": ms + 31_000}), json.dumps({"user": "f0", "x": 0.5, "ts": ms + 32_000})]
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "rules.json").write_text(json.dumps([rule]))
    (tmp_path / "events.jsonl").write_text("\n".join(first + middle + back))
    run_backtest(spark, BacktestConfig(tmp_path / "rules", [InputSpec("events.raw", str(tmp_path / "events.jsonl"))],
                                       tmp_path / "bt", time_field="ts"))
    expected = [json.loads(x) for x in (tmp_path / "bt" / "detections.jsonl").read_text().splitlines()]
    assert sorted(d["ts"] for d in expected) == [ms, ms + 31_000]  # a detection is its event plus members

    with EmbeddedBroker(port=free_port()) as broker:
        bs = broker.bootstrap
        publish_rules([parse_rule(rule)], bs)
        produce(bs, "events.raw", first)
        job = DetectJob(bs, tmp_path / "job", max_offsets_per_trigger=10)
        job.start()
        job.wait_for(lambda s: s.get("lag") == 0, timeout=300)
        # A batch with input after the watermark passed u1's expiry: its timer fires.
        produce(bs, "events.raw", middle)
        job.wait_for(lambda s: s.get("lag") == 0, timeout=120)
        job.batches_after(1)
        produce(bs, "events.raw", back)
        wait_detections(bs, "events.processed", lambda d: len(d) >= 2, timeout=120)
        job.wait_for(lambda s: s.get("lag") == 0, timeout=120)
        got = detections(bs)
        assert job.stop() == 0
    assert_same_detections(got, expected)
