"""What a producer can put on `rules.active` must never break the rule model or the
registry that follows the topic: every record is either a rule or a reported problem.

The oracles are written out here (limits from docs/rule-language.md "Limits", version order
by hand), never derived from the code under test.
"""

from __future__ import annotations

import contextlib
import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from spark_jobs.rules.model import parse_rule
from spark_jobs.rules.version_order import compare_versions
from spark_jobs.streaming.registry import MAX_REPORTED_RAW, apply_record

VELOCITY = {
    "rule_id": "v", "version": "1", "rule_type": "velocity", "source_topic": "events.raw",
    "window_size": 10, "window_unit": "seconds", "aggregation_type": "count", "threshold": 3,
    "group_by": "user", "time_mode": "event_time", "timestamp_field": "ts",
}
CORRELATION = {
    "rule_id": "c", "version": "1", "rule_type": "correlation", "source_topic": "events.raw",
    "context_topic": "context.raw", "correlation_key": "k", "window_size": 1, "window_unit": "hours",
    "context_resolution": "last", "context_value_field": "x", "timestamp_field": "ts",
    "condition": {"operator": ">", "value": 1},
}
THRESHOLD = {
    "rule_id": "t", "version": "1", "rule_type": "threshold", "source_topic": "events.raw",
    "conditions": [{"field": "amount", "operator": ">", "value": 10}],
}


def error_fields(data: dict) -> set[str]:
    with pytest.raises(ValidationError) as info:
        parse_rule(data)
    return {".".join(str(p) for p in e["loc"]) for e in info.value.errors()} | {
        str(e.get("ctx", {}).get("error", "")) for e in info.value.errors()
    }


def rejected_for(data: dict, field: str) -> bool:
    return any(field in f for f in error_fields(data))


# ----------------------------------------------------------------------------- limits


@pytest.mark.parametrize("size,unit", [
    (0, "seconds"), (-5, "minutes"), (math.inf, "seconds"), (math.nan, "days"), (-math.inf, "hours"),
    (36_500, "days"),  # 100 years
    (367, "days"), (10**30, "seconds"), (1e300, "days"),
])
def test_windows_the_engine_cannot_represent_are_rejected(size, unit):
    for base in (VELOCITY, CORRELATION):
        assert rejected_for({**base, "window_size": size, "window_unit": unit}, "window_size")


def test_a_year_window_is_accepted():
    assert parse_rule({**VELOCITY, "window_size": 366, "window_unit": "days"}).window_ms == 366 * 86_400_000


@pytest.mark.parametrize("field,value", [
    ("threshold", math.inf), ("threshold", math.nan), ("threshold", 10**400), ("threshold", 2**53 + 1),
    ("watermark_delay", 7 * 86400 + 1), ("watermark_delay", math.inf), ("watermark_delay", -1),
])
def test_non_finite_or_out_of_range_numbers_are_rejected(field, value):
    assert rejected_for({**VELOCITY, field: value}, field)


def test_condition_values_and_metric_values_must_be_finite():
    assert rejected_for({**THRESHOLD, "conditions": [{"field": "a", "operator": ">", "value": math.inf}]}, "conditions")
    assert rejected_for({**THRESHOLD, "conditions": [{"field": "a", "operator": ">", "value": 10**300}]}, "conditions")
    assert rejected_for({**CORRELATION, "condition": {"operator": ">", "value": math.nan}}, "condition")
    assert rejected_for({**CORRELATION, "max_context_age_seconds": 10**12}, "max_context_age_seconds")


def test_huge_rules_are_rejected():
    assert rejected_for({**THRESHOLD, "description": "x" * 1_000_000}, "description")
    many = [{"field": f"f{i}", "operator": "==", "value": i} for i in range(1000)]
    assert rejected_for({**THRESHOLD, "conditions": many}, "conditions")


def test_json_with_nan_and_infinity_literals_is_rejected():
    for literal in ("NaN", "Infinity", "-Infinity", "1e400"):
        data = json.loads(json.dumps(VELOCITY).replace('"threshold": 3', f'"threshold": {literal}'))
        assert rejected_for(data, "threshold")


# ----------------------------------------------------------------------------- fuzz

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)
FIELDS = sorted(set(VELOCITY) | set(CORRELATION) | set(THRESHOLD) | {"emit_mode", "metric", "conditions", "enabled"})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=JSON)
def test_any_json_value_is_a_rule_or_a_validation_error(data):
    # Anything but a rule or pydantic's ValidationError (OverflowError, RecursionError,
    # TypeError...) fails the test.
    with contextlib.suppress(ValidationError):
        parse_rule(data)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from([VELOCITY, CORRELATION, THRESHOLD]), field=st.sampled_from(FIELDS), value=JSON)
def test_any_value_in_any_field_of_a_valid_rule_is_a_rule_or_a_validation_error(base, field, value):
    try:
        rule = parse_rule({**base, field: value})
    except ValidationError:
        return
    # What validated is something the engine can use: windows and delays in range.
    assert 0 <= rule.window_ms <= 366 * 86_400_000
    if rule.watermark_delay_s is not None:
        assert 0 <= rule.watermark_delay_s <= 7 * 86400


@settings(max_examples=300, deadline=None)
@given(value=st.binary(max_size=200) | JSON.map(lambda v: json.dumps(v).encode()), key=st.none() | st.text(max_size=30))
def test_the_registry_turns_any_record_into_a_rule_or_a_problem(value, key):
    rules: dict = {}
    problem = apply_record(rules, key, value, 7)
    assert problem is None or (problem.offset == 7 and problem.reason)


def test_a_deeply_nested_or_huge_record_is_a_problem_with_a_report_that_fits():
    deep = ("[" * 10_000 + "]" * 10_000).encode()
    assert apply_record({}, "r", deep, 1).reason.startswith("invalid rule")
    huge = json.dumps({**THRESHOLD, "description": "x" * 1_000_000}).encode()
    problem = apply_record({}, "t", huge, 2)
    assert problem.reason.startswith("invalid rule") and "description" in problem.reason
    assert len(problem.raw) <= MAX_REPORTED_RAW and str(len(huge)) in problem.reason
    bad_utf8 = b'{"rule_id": "\xff\xfe"}'
    assert "not JSON" in apply_record({}, None, bad_utf8, 3).reason


# ----------------------------------------------------------------------------- versions


@pytest.mark.parametrize("low,high", [
    ("1", "2"), ("2", "10"), ("1.9", "1.10"), ("v2", "v10"), ("1", "1.1"), ("2.5", "3"), ("0.9", "1"),
    ("2026-01-05", "2026-01-12"), ("1.0", "1.0.1"), ("rc1", "rc2"),
])
def test_version_order(low, high):
    assert compare_versions(low, high) == -1
    assert compare_versions(high, low) == 1
    assert compare_versions(low, low) == 0


def test_digit_runs_compare_as_numbers_not_text():
    assert compare_versions("10", "9") == 1  # as text, "10" < "9"
    assert compare_versions("1.10.0", "1.9.9") == 1
    assert compare_versions("2", "2.0") == -1  # a prefix is the lower version


def _record(version: str, **changes) -> bytes:
    return json.dumps({**THRESHOLD, "version": version, **changes}).encode()


def test_versions_only_move_forward():
    rules: dict = {}
    seen: dict = {}
    assert apply_record(rules, "t", _record("3"), 0, seen) is None
    lower = apply_record(rules, "t", _record("2", conditions=[{"field": "a", "operator": "<", "value": 1}]), 1, seen)
    assert lower is not None and "not newer" in lower.reason
    assert rules["t"].version == "3" and rules["t"].conditions[0].field == "amount"
    same_other_body = apply_record(rules, "t", _record("3", name="changed"), 2, seen)
    assert same_other_body is not None and "another body" in same_other_body.reason
    assert apply_record(rules, "t", _record("3"), 3, seen) is None  # the same record again: fine
    assert apply_record(rules, "t", _record("10"), 4, seen) is None and rules["t"].version == "10"


def test_a_disabled_version_still_counts_and_a_tombstone_resets():
    rules: dict = {}
    seen: dict = {}
    apply_record(rules, "t", _record("5", enabled=False), 0, seen)
    assert "t" not in rules
    assert "not newer" in apply_record(rules, "t", _record("4"), 1, seen).reason
    assert "t" not in rules
    apply_record(rules, "t", None, 2, seen)  # tombstone: the rule is deleted
    assert apply_record(rules, "t", _record("1"), 3, seen) is None and rules["t"].version == "1"
