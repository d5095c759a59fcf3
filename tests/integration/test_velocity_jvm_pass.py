"""The backtest's JVM pass over a velocity group (BatchVelocity) against an oracle
written here: long windows (the pass's columns grow and are compacted as entries leave),
equal timestamps, several keys, values whose exact sum is not their float sum, and both
emit modes. Every velocity value of every event is checked, not only who fired."""

from __future__ import annotations

import json
import math
import random

import pytest
import yaml

from spark_jobs.backtest.inputs import InputSpec
from spark_jobs.backtest.runner import BacktestConfig, run_backtest
from spark_jobs.engine.events import RAW_COLUMNS, parse_events
from spark_jobs.engine.pipeline import evaluate
from spark_jobs.rules.model import parse_rule

pytestmark = pytest.mark.spark

T0 = 1_767_225_600_000
NEVER = -1e30  # a threshold every value passes: the rule emits its value at every event it takes
# (rule id, aggregation, field, window in s, threshold, emit mode, only type "a")
RULES = [
    ("cnt2", "count", None, 2, 1, "all_events", False),
    ("sum60", "sum", "val", 60, NEVER, "all_events", True),
    ("avg60", "avg", "val", 60, NEVER, "all_events", False),
    ("min3600", "min", "val", 3600, NEVER, "all_events", False),
    ("max60", "max", "val", 60, NEVER, "all_events", True),
    ("dc60", "distinct_count", "d", 60, 1, "all_events", False),
    ("cnt60_last", "count", None, 60, 20, "last_event", False),
    ("sum2_last", "sum", "val", 2, 1.0, "last_event", True),
]
VALUES = [0.1, 0.2, 0.7, 3.0, -2.5, 1e-13, 1e20, -1e20, None]  # None: no `val` member
TEXTS = ["a", "b", 1, 2, None, "1"]


def _events() -> list[dict]:
    rnd = random.Random(7)
    out, t = [], {1: 0, 2: 0}
    for _ in range(1400):
        u = rnd.choice([1, 1, 2])
        t[u] += rnd.choice([0, 0, 50, 200, 1000, 5000])
        e: dict = {"u": u, "ts": T0 + t[u], "type": rnd.choice(["a", "a", "b"])}
        if (v := rnd.choice(VALUES)) is not None:
            e["val"] = v
        if rnd.random() < 0.9:  # JSON null included: an event with it does not enter
            e["d"] = rnd.choice(TEXTS)
        out.append(e)
    return out


def _rules():
    rules = []
    for rid, agg, fld, window, threshold, mode, only_a in RULES:
        r = {"rule_id": rid, "version": "1", "rule_type": "velocity", "source_topic": "e", "group_by": "u",
             "window_size": window, "window_unit": "seconds", "aggregation_type": agg, "threshold": threshold,
             "time_mode": "event_time", "timestamp_field": "ts", "emit_mode": mode}
        if fld:
            r["aggregation_field"] = fld
        if only_a:
            r["conditions"] = [{"field": "type", "operator": "==", "value": "a"}]
        rules.append(r)
    return rules


def _expected(events: list[dict]) -> dict[tuple[str, int], float]:
    """(rule id, seq) -> value, of every emitted detection: a loop over each key's
    entered events in (time, arrival) order, each window recomputed from scratch."""
    out = {}
    for rid, agg, fld, window, threshold, mode, only_a in RULES:
        w = window * 1000
        entered = [(e["ts"], i, e) for i, e in enumerate(events)
                   if (not only_a or e["type"] == "a") and (fld is None or e.get(fld) is not None)]
        for u in (1, 2):
            mine = sorted((t, i, e) for t, i, e in entered if e["u"] == u)
            prev = None  # (time, above) of the key's previous entered event
            for n, (t, i, _) in enumerate(mine):
                inside = [e for t2, _, e in mine[: n + 1] if t2 > t - w]
                values = [e[fld] for e in inside] if fld else []
                if agg == "count":
                    value = float(len(inside))
                elif agg == "distinct_count":
                    value = float(len({json.dumps(v) for v in values}))
                elif agg == "sum":
                    value = math.fsum(values)
                elif agg == "avg":
                    value = math.fsum(values) / len(values)
                else:
                    value = float({"min": min, "max": max}[agg](values))
                above = value >= threshold
                crossed = prev is None or prev[0] <= t - w or not prev[1]
                if above and (mode == "all_events" or crossed):
                    out[(rid, i)] = value
                prev = (t, above)
    return out


def test_the_jvm_pass_gives_every_window_value_exactly(spark):
    events = _events()
    raw = spark.createDataFrame([("e", i, json.dumps(e), None) for i, e in enumerate(events)],
                                "topic string, seq long, raw string, proc_ms long").select(*RAW_COLUMNS)
    parsed, _ = parse_events(raw)
    got = {}
    for row in evaluate(parsed, [parse_rule(r) for r in _rules()]).detections.select("rule_id", "seq", "value").collect():
        got[(row["rule_id"], row["seq"])] = float(json.loads(row["value"])["aggregation_value"])
    expected = _expected(events)
    assert got.keys() == expected.keys()
    wrong = {k: (got[k], v) for k, v in expected.items() if got[k] != v}
    assert not wrong, list(wrong.items())[:5]
    # The exact sums are not the floats' running sums: the test would catch a naive sum.
    assert any(got[k] != sum(e["val"] for e in _window(events, k)) for k in got if k[0] == "sum60")


def _window(events: list[dict], key: tuple[str, int]) -> list[dict]:
    """sum60's window at event `key[1]`, in (time, arrival) order."""
    t, u = events[key[1]]["ts"], events[key[1]]["u"]
    inside = [(e["ts"], i, e) for i, e in enumerate(events)
              if e["u"] == u and e["type"] == "a" and "val" in e and t - 60_000 < e["ts"] <= t
              and (e["ts"], i) <= (t, key[1])]
    return [e for *_, e in sorted(inside)]


def test_a_sum_beyond_the_double_range_is_a_dead_letter_and_the_window_goes_on(spark, tmp_path):
    """As the live job (an exact sum beyond the double range cannot be evaluated): the event whose window's exact
    sum overflows is a dead letter for that rule, with the live job's reason, and is not
    taken into the window; the events before and after it are detections."""
    rule = {"rule_id": "big", "version": "1", "rule_type": "velocity", "source_topic": "e", "group_by": "u",
            "window_size": 60, "window_unit": "seconds", "aggregation_type": "sum", "aggregation_field": "val",
            "threshold": 0, "time_mode": "event_time", "timestamp_field": "ts", "emit_mode": "all_events"}
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "big.yaml").write_text(yaml.safe_dump(rule))
    lines = [json.dumps({"u": 1, "ts": T0 + i * 1000, "val": v}) for i, v in enumerate([1e308, 1e308, 1.0])]
    (tmp_path / "e.jsonl").write_text("\n".join(lines) + "\n")
    summary = run_backtest(spark, BacktestConfig(tmp_path / "rules", [InputSpec("e", str(tmp_path / "e.jsonl"))],
                                                 tmp_path / "out"))
    detections = [json.loads(x) for x in (tmp_path / "out" / "detections.jsonl").read_text().splitlines()]
    dead = [json.loads(x) for x in (tmp_path / "out" / "dead_letter.jsonl").read_text().splitlines()]
    assert [(d["ts"], d["aggregation_value"]) for d in detections] == [(T0, 1e308), (T0 + 2000, 1e308)]
    assert dead == [{"topic": "e", "reason": "rule evaluation failed: sum exceeds the double range",
                     "rule_id": "big", "raw": lines[1]}]
    assert (summary["detections"], summary["dead_letter"]) == (2, 1)
