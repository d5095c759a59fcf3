"""Property: the live plan's compiled rule set (compiled.py) passes exactly the (event,
rule) pairs the plain-Python reference evaluator passes, on random rules and events:
threshold rules (one row per event with the rules it passes, made one detection per
pair behind the operators) and velocity rules (one row per (event, key group), the
pairs named by index in it), and the values they cannot read observed per pair.

The compiled plan groups rules by source topic, routes the rules that test one path for
equality with a string by a CASE on the event's value, and looks for unreadable values
once per event; each of those is a place where a rule could be skipped or tested
against the wrong events. The oracle (tests/reference_engine.py) evaluates every
condition of every rule of the event's topic, one by one, in Python.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pyspark.sql import Observation
from pyspark.sql import functions as F
from reference_engine import compare, get_path, parse_event, parse_number

from spark_jobs.engine.events import classify
from spark_jobs.streaming.compiled import key_rows, rows_of
from spark_jobs.streaming.job import event_rows, threshold_detections, threshold_of
from spark_jobs.streaming.keyed_rows import PASS_GID
from spark_jobs.streaming.registry import ROUTED_TOPIC
from spark_jobs.streaming.rule_versions import publish

pytestmark = [pytest.mark.spark]

TOPICS = ["e", "f"]
TYPES = ["a", "b", "c", ""]
VALUES = st.one_of(st.integers(-3, 12), st.sampled_from(["5", " 7 ", "x", "", "1e1", True, False, None, "a", "b"]))


@st.composite
def condition(draw) -> dict:
    field = draw(st.sampled_from(["type", "type", "n", "m", "flag", "deep.x"]))
    op = draw(st.sampled_from(["==", "==", "!=", ">", "<", ">=", "<="]))
    if field == "type" and op == "==":
        value = draw(st.sampled_from(TYPES))
    elif field == "flag":
        value = draw(st.booleans())
    else:
        value = draw(st.one_of(st.integers(-3, 12), st.sampled_from(["5", "a", "x"])))
    return {"field": field, "operator": op, "value": value}


@st.composite
def rules(draw) -> list[dict]:
    out = []
    for i in range(draw(st.integers(1, 12))):
        conds = draw(st.lists(condition(), min_size=1, max_size=4))
        out.append({"rule_id": f"t{i}", "version": "1", "rule_type": "threshold",
                    "source_topic": draw(st.sampled_from(TOPICS)), "conditions": conds})
    return out


@st.composite
def events(draw) -> list[tuple[str, str]]:
    out = []
    for _ in range(draw(st.integers(1, 30))):
        ev: dict = {}
        if draw(st.integers(0, 4)):
            ev["type"] = draw(st.sampled_from(TYPES))
        elif draw(st.booleans()):
            ev["type"] = draw(VALUES)
        for field in ("n", "m", "flag"):
            if draw(st.integers(0, 3)):
                ev[field] = draw(VALUES)
        if draw(st.booleans()):
            ev["deep"] = {"x": draw(VALUES)}
        text = json.dumps(ev) if draw(st.integers(0, 9)) else draw(st.sampled_from(["not json", "[1]", '{"type": "a"']))
        out.append((draw(st.sampled_from(TOPICS)), text))
    return out


def _judged(obj: dict, conds: list[dict]) -> tuple[list[bool], list[bool]]:
    """Per condition: whether it holds, and whether its value cannot be read (a
    non-number under an ordering operator with a numeric rule value)."""
    oks = [compare(get_path(obj, c["field"]), c["operator"], c["value"]) for c in conds]
    unread = [c["operator"] in (">", "<", ">=", "<=") and parse_number(c["value"]) is not None
              and get_path(obj, c["field"]) is not None and parse_number(get_path(obj, c["field"])) is None
              for c in conds]
    return oks, unread


def _reference(rule_list: list[dict], evs: list[tuple[str, str]]) -> tuple[set, set]:
    """(seq, rule_id) pairs that pass, and (seq, rule_id) pairs kept from passing only
    by a value the rule cannot read (a non-number under an ordering operator)."""
    passed, skipped = set(), set()
    for seq, (topic, raw) in enumerate(evs):
        obj = parse_event(raw)
        if obj is None:
            continue
        for r in rule_list:
            if r["source_topic"] != topic:
                continue
            oks, unread = _judged(obj, r["conditions"])
            if all(oks):
                passed.add((seq, r["rule_id"]))
                continue
            if any(unread) and all(o or u for o, u in zip(oks, unread, strict=True)):
                skipped.add((seq, r["rule_id"]))
    return passed, skipped


def _compiled_input(spark, tmp_path_factory, rule_list: list[dict], evs: list[tuple[str, str]]):
    """The rule rows compiled from `rule_list`, `evs` as the job's classified input, and
    the directory whose current version holds `rule_list`'s threshold rules."""
    rows = rows_of({r["rule_id"]: r for r in rule_list}, ROUTED_TOPIC, tmp_path_factory.mktemp("defs"))
    versions = tmp_path_factory.mktemp("versions")
    publish(versions, threshold_of(rows))
    raw = spark.createDataFrame([(seq, topic, text) for seq, (topic, text) in enumerate(evs)],
                                "seq long, topic string, raw string").select(
        F.col("topic").alias("in_topic"), "topic", "seq", F.lit(None).cast("string").alias("route_from"), "raw",
        F.lit(1767600000000).cast("long").alias("proc_ms"))
    return rows, classify(raw), versions


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                   HealthCheck.function_scoped_fixture])
@given(rule_list=rules(), evs=events())
# Routed rules (`type == "a"`) with more than one other condition: every one is checked.
@example(rule_list=[{"rule_id": "t0", "version": "1", "rule_type": "threshold", "source_topic": "e",
                     "conditions": [{"field": "type", "operator": "==", "value": "a"},
                                    {"field": "n", "operator": ">", "value": 1},
                                    {"field": "m", "operator": ">", "value": 1}]},
                    {"rule_id": "t1", "version": "1", "rule_type": "threshold", "source_topic": "e",
                     "conditions": [{"field": "type", "operator": "==", "value": "a"}]}],
         evs=[("e", '{"type": "a", "n": 5, "m": 0}'), ("e", '{"type": "a", "n": 5, "m": 2}'), ("f", '{"type": "a"}')])
# An event of the routed type that passes none of its type's rules but passes an
# unrouted one: its matches must hold no empty entry (found by CI: ",0").
@example(rule_list=[{"rule_id": "t0", "version": "1", "rule_type": "threshold", "source_topic": "e",
                     "conditions": [{"field": "type", "operator": "!=", "value": 0}]},
                    {"rule_id": "t1", "version": "1", "rule_type": "threshold", "source_topic": "e",
                     "conditions": [{"field": "type", "operator": "==", "value": "b"}, {"field": "n", "operator": ">",
                                                                                         "value": 100}]},
                    {"rule_id": "t2", "version": "1", "rule_type": "threshold", "source_topic": "e",
                     "conditions": [{"field": "type", "operator": "==", "value": "b"}, {"field": "n", "operator": ">",
                                                                                         "value": 200}]}],
         evs=[("e", '{"type": "b", "n": 5}'), ("e", '{"type": "c"}')])
def test_compiled_rules_pass_what_the_reference_passes(spark, tmp_path_factory, rule_list, evs):
    rows, raw, versions = _compiled_input(spark, tmp_path_factory, rule_list, evs)
    carried = _carried(raw, rows, versions)
    # One row per event, whatever number of rules it passes.
    matched = [r["seq"] for r in carried.filter(F.col("kind") == "threshold").collect()]
    assert len(matched) == len(set(matched))
    out = threshold_detections(carried).collect()
    got = {(r["seq"], r["rule_id"]) for r in out if r["kind"] == "detection"}
    dead = {r["seq"] for r in out if r["kind"] == "dead"}
    passed, _ = _reference(rule_list, evs)
    assert got == passed
    assert dead == {seq for seq, (_, text) in enumerate(evs) if parse_event(text) is None}


def _carried(raw, rows, versions, skipped_metric: str | Observation = "skipped_keyed"):
    """The rows the live plan carries through its operators (OUTPUT_SCHEMA's columns)."""
    keyed, _ = event_rows(raw, rows, set(), 5_000, skipped_metric, versions=versions)
    return keyed.filter(F.col("gid") == PASS_GID).select("topic", "seq", "raw", "_pass.*")


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                   HealthCheck.function_scoped_fixture])
@given(rule_list=rules(), evs=events())
def test_compiled_rules_count_the_values_they_cannot_read(spark, tmp_path_factory, rule_list, evs):
    rows, raw, versions = _compiled_input(spark, tmp_path_factory, rule_list, evs)
    skips = Observation("skips")
    _carried(raw, rows, versions, skips).collect()
    expected: Counter = Counter()
    for seq, rule_id in _reference(rule_list, evs)[1]:
        obj = parse_event(evs[seq][1])
        conds = next(r for r in rule_list if r["rule_id"] == rule_id)["conditions"]
        first = next(c for c, u in zip(conds, _judged(obj, conds)[1], strict=True) if u)
        expected[(rule_id, f"value at {_path_text(first['field'])} is not a number")] += 1
    assert Counter(tuple(e.split("\u001f")) for e in skips.get["rows"]) == expected


@st.composite
def velocity_rules(draw) -> list[dict]:
    out = []
    for i in range(draw(st.integers(1, 8))):
        agg, field = draw(st.sampled_from([("count", None), ("count", "n"), ("sum", "n"), ("max", "deep.x"),
                                           ("distinct_count", "m")]))
        rule = {"rule_id": f"v{i}", "version": "1", "rule_type": "velocity",
                "source_topic": draw(st.sampled_from(TOPICS)), "window_size": 10, "window_unit": "seconds",
                "aggregation_type": agg, "threshold": 2,
                "conditions": draw(st.lists(condition(), min_size=0, max_size=3))}
        if field:
            rule["aggregation_field"] = field
        group_by = draw(st.sampled_from(["m", "deep.x", None]))
        if group_by:
            rule["group_by"] = group_by
        out.append(rule)
    return out


def _path_text(field: str) -> str:
    """A dotted field as the live plan names it in a reason (`$['a']['b']`)."""
    return "$" + "".join(f"['{part}']" for part in field.split("."))


def _keyed_reference(rule_list: list[dict], evs: list[tuple[str, str]]) -> tuple[Counter, Counter]:
    """(seq, rule_id, key group) of each (event, velocity rule) the event enters, and
    (rule_id, reason) of each one a value the rule cannot read kept out."""
    entered, skipped = Counter(), Counter()
    for seq, (topic, raw) in enumerate(evs):
        obj = parse_event(raw)
        if obj is None:
            continue
        for r in rule_list:
            if r["source_topic"] != topic:
                continue
            conds = r["conditions"]
            oks, unread = _judged(obj, conds)
            if not all(oks):
                if any(unread) and all(o or u for o, u in zip(oks, unread, strict=True)):
                    first = next(c for c, u in zip(conds, unread, strict=True) if u)
                    skipped[(r["rule_id"], f"value at {_path_text(first['field'])} is not a number")] += 1
                continue
            field = r.get("aggregation_field")
            value = get_path(obj, field) if field else None
            if r["aggregation_type"] in ("sum", "max") and value is not None and parse_number(value) is None:
                skipped[(r["rule_id"], f"value at {_path_text(field)} is not a number")] += 1
                continue
            if field and (value is None or (r["aggregation_type"] in ("sum", "max") and parse_number(value) is None)):
                continue
            if r.get("group_by") and get_path(obj, r["group_by"]) is None:
                continue
            entered[(seq, r["rule_id"], _path_text(r["group_by"]) if r.get("group_by") else "")] += 1
    return entered, skipped


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                   HealthCheck.function_scoped_fixture])
@given(rule_list=velocity_rules(), evs=events())
def test_keyed_rows_name_the_rules_the_reference_enters(spark, tmp_path_factory, rule_list, evs):
    rows, raw, _ = _compiled_input(spark, tmp_path_factory, rule_list, evs)
    skips = Observation("skips")
    keyed, slots = key_rows(raw, rows, skipped_metric=skips)
    got_rows = keyed.collect()
    rule_of = {r.rule_ref: r.rule_id for r in rows}
    got: Counter = Counter()
    for row in got_rows:
        assert row["k"] is not None and row["m"]
        # One row per (event, key group).
        assert sum(1 for o in got_rows if (o["seq"], o["gid"]) == (row["seq"], row["gid"])) == 1
        for i in row["m"].split(","):
            got[(row["seq"], rule_of[slots[int(i)].rule_ref], row["gid"])] += 1
    entered, skipped = _keyed_reference(rule_list, evs)
    assert got == entered
    observed = Counter(tuple(e.split("\u001f")) for e in skips.get["rows"])
    assert observed == skipped
