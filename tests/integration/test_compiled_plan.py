"""Property: the live plan's rule-set evaluator passes exactly the (event, rule) pairs
the plain-Python reference evaluator passes, on random rules and events: threshold
rules (one row per event with the rules it passes, made one detection per pair behind
the operators) and velocity rules (one row per (event, key group), the entered rule
rows named by index in the batch's version, with their event times), and the values
they cannot read observed per pair.

The evaluator indexes rules by source topic and by the string equality they test, and
looks for unreadable values once per event; each of those is a place where a rule could
be skipped or tested against the wrong events. The oracle (tests/reference_engine.py)
evaluates every condition of every rule of the event's topic, one by one, in Python.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pyspark.sql import Observation
from pyspark.sql import functions as F
from reference_engine import compare, get_path, parse_event, parse_number, parse_timestamp_ms

from spark_jobs.engine.events import classify
from spark_jobs.engine.rule_set import FIRST
from spark_jobs.streaming.job import event_rows, threshold_detections
from spark_jobs.streaming.keyed_input import key_rows
from spark_jobs.streaming.keyed_rows import PASS_GID
from spark_jobs.streaming.registry import ROUTED_TOPIC
from spark_jobs.streaming.rule_versions import current, publish
from spark_jobs.streaming.rules_source import rows_of

pytestmark = [pytest.mark.spark]

TOPICS = ["e", "f"]
TYPES = ["a", "b", "c", ""]
# Event times: epoch seconds and ms (numbers and numeric strings), ISO-8601 with and
# without an offset, one more than 5 s ahead of the broker time (PROC_MS), out of range,
# and none.
PROC_MS = 1767600000000
TIMES = st.sampled_from([1767600000, 1767600000.5, 1767600000123, "1767600001", "2026-01-05T08:00:00Z",
                         "2026-01-05T10:00:03.25+02:00", "2026-01-05T12:00:00", 1e30, -1e30, "not a time", True, None])
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
        if draw(st.booleans()):
            ev["ts"] = draw(TIMES)
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
    rows = rows_of({r["rule_id"]: r for r in rule_list}, ROUTED_TOPIC)
    versions = tmp_path_factory.mktemp("versions")
    publish(versions, rows)
    raw = spark.createDataFrame([(seq, topic, text) for seq, (topic, text) in enumerate(evs)],
                                "seq long, topic string, raw string").select(
        F.col("topic").alias("in_topic"), "topic", "seq", F.lit(None).cast("string").alias("route_from"), "raw",
        F.lit(PROC_MS).cast("long").alias("proc_ms"))
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
    keyed = event_rows(raw, versions, 5_000, skipped_metric, thresholds=True)
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
        if draw(st.booleans()):
            rule.update(time_mode="event_time", timestamp_field="ts")
        out.append(rule)
    return out


def _path_text(field: str) -> str:
    """A dotted field as the live plan names it in a reason (`$['a']['b']`)."""
    return "$" + "".join(f"['{part}']" for part in field.split("."))


# Event times the engine accepts (docs/rule-language.md, "Timestamps"): years 0001 to 9999.
MIN_EVENT_MS, MAX_EVENT_MS = -62_135_596_800_000, 253_402_300_799_999
FAR = "event time more than 5000 ms ahead of the record's broker timestamp"
NO_TIME = "missing or unparseable timestamp field 'ts' needed by velocity rule"  # docs/rule-language.md


def _event_time(obj: dict) -> tuple[int | None, str | None]:
    """The event's `ts` as an event-time rule reads it: epoch ms (None: missing,
    unparseable or out of range), and why it is unusable (missing, or too far ahead)."""
    ms = parse_timestamp_ms(get_path(obj, "ts"))
    if ms is None or not MIN_EVENT_MS <= ms <= MAX_EVENT_MS:
        return None, NO_TIME
    return ms, FAR if ms > PROC_MS + 5_000 else None


def _keyed_reference(rule_list: list[dict], evs: list[tuple[str, str]]) -> tuple[Counter, Counter, dict]:
    """(seq, rule_id, key group, time, why the time is unusable) of each (event, velocity rule) the
    event enters (a processing-time rule's time is the broker time), (rule_id, reason)
    of each one a value the rule cannot read kept out, and per (seq, key group) the
    newest usable event time of its event-time rules (the job watermark's input)."""
    entered, skipped, newest = Counter(), Counter(), {}
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
            gid = _path_text(r["group_by"]) if r.get("group_by") else ""
            ts, far = _event_time(obj) if r.get("time_mode") == "event_time" else (PROC_MS, None)
            entered[(seq, r["rule_id"], gid, ts, far)] += 1
            if r.get("time_mode") == "event_time" and far is None:
                newest[(seq, gid)] = max(ts, newest.get((seq, gid), ts))
    return entered, skipped, newest


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                   HealthCheck.function_scoped_fixture])
@given(rule_list=velocity_rules(), evs=events())
def test_keyed_rows_name_the_rules_the_reference_enters(spark, tmp_path_factory, rule_list, evs):
    rows, raw, versions = _compiled_input(spark, tmp_path_factory, rule_list, evs)
    skips = Observation("skips")
    got_rows = key_rows(raw, FIRST, str(versions), 5_000, skips, passing=[]).collect()
    # A member names its rule row by its index in the version the rows were made with.
    spec = json.loads((versions / "specs" / f"{current(versions)}.json").read_text())
    rule_of = [row["rule"]["rule_id"] for row in spec["keyed"]]
    got: Counter = Counter()
    newest = {}
    for row in got_rows:
        assert row["k"] is not None and row["mem"]
        # One row per (event, key group).
        assert sum(1 for o in got_rows if (o["seq"], o["gid"]) == (row["seq"], row["gid"])) == 1
        for m in row["mem"]:
            got[(row["seq"], rule_of[m["i"]], row["gid"], m["ts"], m["issue"])] += 1
        if row["wm"] is not None:
            newest[(row["seq"], row["gid"])] = row["wm"]
    entered, skipped, expected_newest = _keyed_reference(rule_list, evs)
    assert got == entered
    assert newest == expected_newest
    observed = Counter(tuple(e.split("\u001f")) for e in skips.get["rows"])
    assert observed == skipped
