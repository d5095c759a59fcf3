"""Property tests: the Spark engine against the plain-Python reference evaluator
(tests/reference_engine.py) on random events and random rules. Identical detections."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from reference_engine import RefEvent, evaluate, parse_timestamp_ms

from spark_jobs.engine.events import RAW_COLUMNS, parse_events
from spark_jobs.engine.pipeline import evaluate as spark_evaluate
from spark_jobs.engine.values import field, timestamp_ms
from spark_jobs.rules.model import parse_rule

pytestmark = pytest.mark.spark

BASE_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
KEYS = [1, "1", 2, "b", None]  # 1 and "1" are different keys; None = JSON null (missing)
VALUES = st.one_of(
    st.integers(-5, 20),
    st.sampled_from(["3", "-2", " 7 ", "x", "", "1e1", True]),
    st.none(),
)


# Each Spark run judges several examples at once (a run costs seconds of planning, an
# example's data almost nothing): example j's events carry `ex: j` and start j hours
# after example 0's, so none is late for another's, and each of its rules that has
# conditions first asks for `ex == j`. A rule drawn without conditions keeps none and
# sees every example's events: a larger input, judged by both engines all the same.
HOUR_MS = 3_600_000


def apart(j: int, evs: list[dict], rules: list[dict]) -> tuple[list[dict], list[dict]]:
    """Example j of a run: its events and rules (ids prefixed)."""
    for e in evs:
        e["ex"] = j
    own = {"field": "ex", "operator": "==", "value": j}
    return evs, [{**r, "rule_id": f"x{j}_{r['rule_id']}"}
                 | ({"conditions": [own, *r["conditions"]]} if r.get("conditions") else {})
                 for r in rules]


def batch(n: int, example: Callable[[int], tuple[list[dict], list[dict]]]) -> tuple[list[dict], list[dict]]:
    """n examples (`example(offset_ms)`: events and rules) as one run's (see apart)."""
    evs: list[dict] = []
    rules: list[dict] = []
    for j in range(n):
        e, r = apart(j, *example(j * HOUR_MS))
        evs, rules = evs + e, rules + r
    return evs, rules


@st.composite
def events(draw, offset_ms: int = 0) -> list[dict]:
    n = draw(st.integers(1, 40))
    out = []
    t = 0
    for _ in range(n):
        # Mostly increasing time with duplicates and some disorder.
        t = max(0, t + draw(st.sampled_from([0, 0, 200, 500, 900, 1500, 3000, -700])))
        ev: dict = {"type": draw(st.sampled_from(["a", "b"]))}
        key = draw(st.sampled_from(KEYS + ["<absent>"]))
        if key != "<absent>":
            ev["u"] = key
        val = draw(VALUES)
        if val is not None or draw(st.booleans()):
            ev["val"] = val
        style = draw(st.sampled_from(["ms", "iso", "s", "missing"] if draw(st.integers(0, 9)) == 0 else ["ms", "iso", "s"]))
        at = offset_ms + t
        ms = BASE_MS + at
        if style == "ms":
            ev["ts"] = ms
        elif style == "s":
            ev["ts"] = ms / 1000
        elif style == "iso":
            ev["ts"] = f"2026-01-01T{at // HOUR_MS:02d}:{at // 60000 % 60:02d}:{at // 1000 % 60:02d}.{at % 1000:03d}Z"
        out.append(ev)
    return out


@st.composite
def velocity_rules(draw, idx: int) -> dict:
    agg = draw(st.sampled_from(["count", "sum", "avg", "min", "max", "distinct_count"]))
    rule = {
        "rule_id": f"v{idx}",
        "version": str(draw(st.integers(1, 3))),
        "rule_type": "velocity",
        "source_topic": "e",
        "window_size": draw(st.sampled_from([1, 2, 3, 5])),
        "window_unit": "seconds",
        "aggregation_type": agg,
        "threshold": draw(st.integers(-3, 12)) if agg in ("sum", "avg", "min", "max") else draw(st.integers(1, 6)),
        "emit_mode": draw(st.sampled_from(["last_event", "all_events"])),
        "time_mode": draw(st.sampled_from(["event_time", "processing_time"])),
    }
    if rule["time_mode"] == "event_time":
        rule["timestamp_field"] = "ts"
    if (agg != "count" or draw(st.booleans())) and (agg != "count" or draw(st.booleans())):
        rule["aggregation_field"] = "val"
    if draw(st.booleans()):
        rule["group_by"] = "u"
    if draw(st.booleans()):
        rule["conditions"] = [{"field": "type", "operator": draw(st.sampled_from(["==", "!="])), "value": "a"}]
    return rule


def run_both(spark, rule_dicts: list[dict], evs: list[dict]):
    rules = [parse_rule(r) for r in rule_dicts]
    raws = [json.dumps(e) for e in evs]
    ref_events = [
        RefEvent("e", raw, i, parse_timestamp_ms(e.get("ts")) if e.get("ts") is not None else None)
        for i, (raw, e) in enumerate(zip(raws, evs, strict=True))
    ]
    expected = {
        (d.rule_id, d.seq, None if d.aggregation_value is None else round(d.aggregation_value, 6))
        for d in evaluate(rules, ref_events)
    }
    raw_df = spark.createDataFrame([("e", i, raw, None) for i, raw in enumerate(raws)], "topic string, seq long, raw string, proc_ms long").select(*RAW_COLUMNS)
    parsed, _ = parse_events(raw_df)
    parsed = parsed.withColumn("proc_ms", F.coalesce("proc_ms", timestamp_ms(field(F.col("v"), "ts"))))
    result = spark_evaluate(parsed, rules)
    got = set()
    for row in result.detections.collect():
        d = json.loads(row["value"])
        agg = d.get("aggregation_value")
        got.add((row["rule_id"], row["seq"], None if agg is None else round(float(agg), 6)))
    return expected, got


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_velocity_rules_match_reference(spark, data):
    # 25 examples of 4 rules each
    evs, rules = batch(5, lambda at: (data.draw(events(at)), [data.draw(velocity_rules(i)) for i in range(4)]))
    expected, got = run_both(spark, rules, evs)
    assert got == expected


THRESHOLD_VALUES = st.one_of(st.integers(-3, 10), st.sampled_from(["3", "x", "a", "b", True, False, 2.5, "2.5"]))


def threshold_example(data, offset_ms: int) -> tuple[list[dict], list[dict]]:
    evs = data.draw(events(offset_ms))
    for e in evs:  # a few more shapes for the comparison semantics
        if data.draw(st.booleans()):
            e["flag"] = data.draw(st.sampled_from([True, False, "true", 1, {"x": 1}, [1]]))
        if data.draw(st.booleans()):
            e["user"] = {"id": data.draw(st.sampled_from([1, "1", "a", None]))}
    rules = []
    for i in range(6):
        conds = [
            {
                "field": data.draw(st.sampled_from(["val", "type", "flag", "user.id", "u", "nope"])),
                "operator": data.draw(st.sampled_from(["==", "!=", ">", "<", ">=", "<="])),
                "value": data.draw(THRESHOLD_VALUES),
            }
            for _ in range(data.draw(st.integers(1, 2)))
        ]
        rules.append({"rule_id": f"t{i}", "version": "1", "rule_type": "threshold", "source_topic": "e", "conditions": conds})
    return evs, rules


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_threshold_conditions_match_reference(spark, data):
    evs, rules = batch(3, lambda at: threshold_example(data, at))  # 15 examples of 6 rules each
    expected, got = run_both(spark, rules, evs)
    assert got == expected


@st.composite
def correlation_rules(draw, idx: int) -> dict:
    resolution = draw(st.sampled_from(["last", "mean", "mean_std"]))
    metrics = ["direct", "ratio_deviation", "difference"] + (["z_score"] if resolution == "mean_std" else [])
    metric = draw(st.sampled_from(metrics))
    rule = {
        "rule_id": f"c{idx}", "version": "1", "rule_type": "correlation", "source_topic": "e",
        "context_topic": "ctx", "correlation_key": "u", "window_size": draw(st.sampled_from([2, 5, 30])),
        "window_unit": "seconds", "context_resolution": resolution, "context_value_field": "val",
        "timestamp_field": "ts", "metric": metric,
        "condition": {"operator": draw(st.sampled_from([">", "<", ">=", "<=", "==", "!="])), "value": draw(st.integers(-3, 6))},
    }
    if metric != "direct":
        rule["event_value_field"] = "val"
    if draw(st.booleans()):
        rule["max_context_age_seconds"] = draw(st.sampled_from([1, 3, 20]))
    if resolution != "last" and draw(st.booleans()):
        rule["min_context_points"] = draw(st.integers(1, 3))
    return rule


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_correlation_rules_match_reference(spark, data):
    primaries = data.draw(events())
    context = data.draw(events())
    for e in primaries + context:  # a few shared keys, so primaries find context
        if data.draw(st.integers(0, 9)) < 8:
            e["u"] = data.draw(st.sampled_from([1, 1, "1", 2]))
    rules = [parse_rule(data.draw(correlation_rules(i))) for i in range(3)]
    raws = [("e", json.dumps(e)) for e in primaries] + [("ctx", json.dumps(e)) for e in context]
    order = data.draw(st.permutations(range(len(raws))))  # arrival order across both topics
    arrived = [raws[i] for i in order]
    ref_events = [RefEvent(t, raw, i) for i, (t, raw) in enumerate(arrived)]
    expected = {
        (d.rule_id, d.seq, None if d.metric_value is None else round(d.metric_value, 6))
        for d in evaluate(rules, ref_events)
    }
    raw_df = spark.createDataFrame([(t, i, raw, None) for i, (t, raw) in enumerate(arrived)],
                                   "topic string, seq long, raw string, proc_ms long").select(*RAW_COLUMNS)
    parsed, _ = parse_events(raw_df)
    got = set()
    for row in spark_evaluate(parsed, rules).detections.collect():
        d = json.loads(row["value"])
        mv = d.get("metric_value")
        got.add((row["rule_id"], row["seq"], None if mv is None else round(float(mv), 6)))
    assert got == expected
