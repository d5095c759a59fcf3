"""Velocity rules of a group that share conditions and value share their window columns.

Spark computes every window expression a plan names, equal ones too: three rules
summing `val` under the same conditions had the running sum three times in their
Window operator. These tests read the plan Spark builds and the values it gives,
against an oracle written here (a loop over the events).
"""

from __future__ import annotations

import json
import re

import pytest

from spark_jobs.engine.events import RAW_COLUMNS, parse_events
from spark_jobs.engine.pipeline import evaluate
from spark_jobs.rules.model import parse_rule

pytestmark = pytest.mark.spark

T0 = 1_767_225_600_000
ENTERS = [{"field": "type", "operator": "==", "value": "a"}]
# (rule id, aggregation, field, window in s, threshold): every rule emits at every event
# it takes (all_events, a threshold every value passes), so its values can be checked.
RULES = [
    ("sum2", "sum", "val", 2, -1000),
    ("sum5", "sum", "val", 5, -1000),
    ("avg5", "avg", "val", 5, -1000),
    ("max2", "max", "val", 2, -1000),
    ("max5", "max", "val", 5, -1000),
    ("cnt2", "count", None, 2, 1),
]
# (user, ms after T0, type, val): two users, equal timestamps, events of another type
# and events without the value, which do not enter the value rules' windows.
EVENTS = [
    (1, 0, "a", 5.0), (1, 500, "a", 1.5), (1, 500, "a", 7.0), (1, 900, "b", 100.0), (1, 1999, "a", None),
    (1, 2000, "a", 2.0), (1, 2500, "a", -3.0), (1, 4999, "a", 4.0), (1, 5000, "a", 0.5), (1, 9000, "a", 8.0),
    (2, 0, "a", 50.0), (2, 1000, "a", 60.0), (2, 1000, "b", 70.0), (2, 6000, "a", 10.0),
]


def _rules():
    out = []
    for rid, agg, fld, window, threshold in RULES:
        r = {"rule_id": rid, "version": "1", "rule_type": "velocity", "source_topic": "e", "group_by": "u",
             "window_size": window, "window_unit": "seconds", "aggregation_type": agg, "threshold": threshold,
             "time_mode": "event_time", "timestamp_field": "ts", "emit_mode": "all_events", "conditions": ENTERS}
        if fld:
            r["aggregation_field"] = fld
        out.append(parse_rule(r))
    return out


def _events(spark):
    rows = []
    for i, (u, t, typ, val) in enumerate(EVENTS):
        e = {"u": u, "ts": T0 + t, "type": typ}
        if val is not None:
            e["val"] = val
        rows.append(("e", i, json.dumps(e), None))
    raw_df = spark.createDataFrame(rows, "topic string, seq long, raw string, proc_ms long").select(*RAW_COLUMNS)
    parsed, _ = parse_events(raw_df)
    return parsed


def _expected() -> dict[tuple[str, int], float]:
    """(rule id, event index) -> the value of the rule's window at that event: the
    user's events that entered it, in (t - W, t], taken at or before it."""
    out = {}
    for rid, agg, fld, window, _ in RULES:
        for i, (u, t, typ, val) in enumerate(EVENTS):
            if typ != "a" or (fld and val is None):
                continue
            seen = [v for u2, t2, typ2, v in EVENTS[: i + 1]
                    if u2 == u and typ2 == "a" and t - window * 1000 < t2 <= t and (v is not None or not fld)]
            if agg == "count":
                out[(rid, i)] = len(seen)
            else:  # the event itself is among them
                out[(rid, i)] = {"sum": sum, "avg": lambda xs: sum(xs) / len(xs), "max": max}[agg](seen)
    return out


def test_each_rule_gets_its_own_window(spark):
    got = {}
    for row in evaluate(_events(spark), _rules()).detections.select("rule_id", "value").collect():
        d = json.loads(row["value"])
        got[(row["rule_id"], d["ts"] - T0, d.get("val"))] = d["aggregation_value"]
    expected = {(rid, EVENTS[i][1], EVENTS[i][3]): v for (rid, i), v in _expected().items()}
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert abs(got[key] - value) < 1e-9, (key, got[key], value)


def test_every_velocity_rule_is_one_pass_over_one_sort_whatever_the_topics_and_keys(spark):
    # The rules, and copies of them on other topics, keys and clocks: 24 rules in 4
    # (topic, key, clock) groups, one MapPartitions over one sort by (rule, key, time,
    # arrival), and no Window operator.
    rules = list(_rules())
    for n, (topic, key, clock) in enumerate([("f", "u", "event_time"), ("e", "type", "event_time"),
                                             ("g", "u", "processing_time")]):
        for r in _rules():
            d = r.model_dump(mode="json") | {"rule_id": f"{r.rule_id}_{n}", "source_topic": topic, "group_by": key,
                                              "time_mode": clock}
            if clock == "processing_time":
                d.pop("timestamp_field")
            rules.append(parse_rule(d))
    plan = evaluate(_events(spark), rules).detections._jdf.queryExecution().executedPlan().toString()
    assert "Window [" not in plan and "WindowExec" not in plan
    assert plan.count("MapPartitions") == 1
    sort = r"Sort \[_i#\d+ ASC NULLS FIRST, k#\d+ ASC NULLS FIRST, ts_ms#\d+L ASC NULLS FIRST, seq#\d+L ASC NULLS FIRST\]"
    assert len(re.findall(sort, plan)) == 1
