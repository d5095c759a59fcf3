"""An independent, deliberately naive reference evaluator of the rule language.

It exists only to be compared against the Spark engine in property tests. It reads
docs/rule-language.md (the rule kinds, "Values, paths and comparisons", "Timestamps") literally and favours
obviousness over speed: every window and every context lookup is recomputed from scratch
(O(n^2) per rule), there is no state, no watermark and no wall clock.

It models the *backtest* semantics: each key's events are taken in event-time order
(`(timestamp, seq)`), and a correlation primary sees all context of its key inside its
lookback regardless of arrival order (the "held primary re-evaluated when context
arrives" behaviour; nothing is ever late here).

Deliberate choices where the spec leaves room are marked "CHOICE:" below.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from spark_jobs.rules.model import (
    AnyRule,
    Condition,
    CorrelationRule,
    ThresholdRule,
    VelocityRule,
    parse_rule,
)

__all__ = [
    "RefDetection",
    "RefEvent",
    "compare",
    "evaluate",
    "get_path",
    "json_key",
    "parse_event",
    "parse_number",
    "parse_timestamp_ms",
]


@dataclass(frozen=True)
class RefEvent:
    topic: str
    raw: str  # the JSON text of the event as it arrived
    seq: int  # arrival order (global, increasing)
    proc_ts_ms: int | None = None  # processing time, used by processing_time velocity rules


@dataclass(frozen=True)
class RefDetection:
    rule_id: str
    rule_version: str
    raw: str  # raw text of the event the detection is about (the primary for correlation)
    seq: int  # its arrival seq
    aggregation_value: float | None = None  # velocity
    context_value: float | str | None = None  # correlation: resolved context (last value or mean)
    metric_value: float | None = None  # correlation


# --------------------------------------------------------------------------- JSON values


def _reject_constant(name: str) -> Any:
    raise ValueError(f"not JSON: {name}")


def parse_event(raw: str) -> dict | None:
    """The event as a JSON object, or None when it is not one (dead-lettered elsewhere).

    CHOICE: the non-standard literals NaN / Infinity / -Infinity (which Python's json
    module accepts by default) are rejected: such text is not JSON.
    """
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, TypeError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def get_path(obj: Any, path: str) -> Any:
    """Value at a dotted path (`user.id` -> obj["user"]["id"]); None when missing.

    A missing key, a non-object in the middle of the path, or JSON null all give None,
    i.e. "missing".
    """
    current = obj
    for part in path.split("."):
        if not isinstance(current, dict) or part not in current:
            return None
        current = current[part]
    return current


# CHOICE: a "numeric string" is, after stripping ASCII whitespace, a plain decimal number
# in ASCII digits with optional sign, fraction and exponent ("250", " -1.5 ", "1e3", ".5",
# "1."), whose value is finite. Python's float() alone would also accept "1_000", "nan",
# "inf" and non-ASCII digits; those are NOT numeric here.
_NUMERIC_STRING = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_ASCII_WHITESPACE = " \t\n\r\f\v"


def parse_number(value: Any) -> float | None:
    """The value as a float when it is a number or a numeric string, else None.

    Booleans are not numbers. Only finite numbers count (docs/rule-language.md, "Values, paths and
    comparisons"): json.loads turns an overflowing literal such as 1e400 into inf,
    and an int too large for a double overflows; neither is a number a rule can use.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:
            return None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        text = value.strip(_ASCII_WHITESPACE)
        if not _NUMERIC_STRING.fullmatch(text):
            return None
        number = float(text)
        return number if math.isfinite(number) else None
    return None


def _json_equal(a: Any, b: Any) -> bool:
    """Equality of JSON values (so True != 1, "true" != True, 5 != "five")."""
    return json_key(a) == json_key(b)


def json_key(value: Any) -> str:
    """The identity of a JSON value, used for group keys, correlation keys and
    distinct_count: 1 and "1" differ; so do 1 and 1.0 (json.dumps gives "1" vs "1.0")."""
    return json.dumps(value, sort_keys=True)


def compare(a: Any, operator: str, b: Any) -> bool:
    """`a <operator> b` for an event value `a` (None = missing) and a rule value `b`."""
    if a is None:
        return False  # a missing field never matches, whatever the operator
    a_number = parse_number(a)
    b_number = parse_number(b)
    if a_number is not None and b_number is not None:
        if operator == "==":
            return a_number == b_number
        if operator == "!=":
            return a_number != b_number
        if operator == ">":
            return a_number > b_number
        if operator == "<":
            return a_number < b_number
        if operator == ">=":
            return a_number >= b_number
        if operator == "<=":
            return a_number <= b_number
        raise ValueError(f"unknown operator {operator!r}")
    if operator == "==":
        return _json_equal(a, b)
    if operator == "!=":
        return not _json_equal(a, b)
    if operator in (">", "<", ">=", "<="):
        return False  # ordering on non-numeric values never matches
    raise ValueError(f"unknown operator {operator!r}")


def _conditions_hold(obj: dict, conditions: list[Condition]) -> bool:
    return all(compare(get_path(obj, c.field), c.operator, c.value) for c in conditions)


# --------------------------------------------------------------------------- timestamps

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def parse_timestamp_ms(value: Any) -> int | None:
    """Epoch milliseconds of a timestamp value, or None when missing/unparseable.

    A number or numeric string is epoch milliseconds when > 1e11, else epoch seconds
    (fractions allowed); the result is floored to an integer millisecond
    (CHOICE: computed in float arithmetic, `floor(seconds * 1000)`). Any other string is
    ISO-8601 (`datetime.fromisoformat`, a trailing "Z" read as "+00:00"); no offset = UTC.
    """
    if value is None or isinstance(value, bool):
        return None
    number = parse_number(value)
    if number is not None:
        millis = number if number > 1e11 else number * 1000.0
        try:
            return math.floor(millis)
        except (OverflowError, ValueError):  # inf / nan
            return None
    if not isinstance(value, str):
        return None
    text = value[:-1] + "+00:00" if value.endswith("Z") else value
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // timedelta(milliseconds=1)  # floor division: floored ms


# --------------------------------------------------------------------------- threshold


def _evaluate_threshold(rule: ThresholdRule, parsed: list[tuple[RefEvent, dict]]) -> list[RefDetection]:
    return [
        RefDetection(rule.rule_id, rule.version, event.raw, event.seq)
        for event, obj in parsed
        if event.topic == rule.source_topic and _conditions_hold(obj, rule.conditions)
    ]


# --------------------------------------------------------------------------- velocity


@dataclass(frozen=True)
class _WindowEntry:
    ts: int
    seq: int
    value: Any  # None for count, a float for sum/avg/min/max, a json_key for distinct_count
    event: RefEvent
    obj: dict


def _velocity_timestamp(rule: VelocityRule, event: RefEvent, obj: dict) -> int | None:
    if rule.time_mode == "event_time":
        assert rule.timestamp_field is not None
        return parse_timestamp_ms(get_path(obj, rule.timestamp_field))
    # CHOICE: proc_ts_ms is already epoch milliseconds; it is used as is (no seconds
    # heuristic). The caller derives it (broker timestamp, or --time-field parsed with
    # parse_timestamp_ms for file inputs).
    if event.proc_ts_ms is None:
        return None
    return math.floor(event.proc_ts_ms)


def _aggregate(aggregation_type: str, values: list[Any]) -> float:
    if aggregation_type == "count":
        return float(len(values))
    if aggregation_type == "sum":
        return float(sum(values))
    if aggregation_type == "avg":
        return float(sum(values)) / len(values)
    if aggregation_type == "min":
        return float(min(values))
    if aggregation_type == "max":
        return float(max(values))
    if aggregation_type == "distinct_count":
        return float(len(set(values)))
    raise ValueError(f"unknown aggregation {aggregation_type!r}")


def _evaluate_velocity(
    rule: VelocityRule, parsed: list[tuple[RefEvent, dict]]
) -> list[tuple[RefEvent, dict, float]]:
    """The events this rule emits, with the aggregation value at each."""
    entries_by_key: dict[str, list[_WindowEntry]] = {}
    for event, obj in parsed:
        if event.topic != rule.source_topic:
            continue
        if not _conditions_hold(obj, rule.conditions):
            continue
        if rule.group_by is None:
            key = ""  # one global window for the rule
        else:
            group_value = get_path(obj, rule.group_by)
            if group_value is None:
                continue
            key = json_key(group_value)
        ts = _velocity_timestamp(rule, event, obj)
        if ts is None:
            continue
        value: Any = None
        # CHOICE (docs/rule-language.md, velocity "What enters the window"): an event
        # lacking the rule's aggregation_field
        # does not enter the window, even for `count` when the (optional) field is set.
        if rule.aggregation_field is not None:
            raw_value = get_path(obj, rule.aggregation_field)
            if raw_value is None:
                continue
            if rule.aggregation_type == "distinct_count":
                value = json_key(raw_value)
            elif rule.aggregation_type != "count":
                value = parse_number(raw_value)
                if value is None:
                    continue  # sum/avg/min/max need a numeric value
        entries_by_key.setdefault(key, []).append(_WindowEntry(ts, event.seq, value, event, obj))

    emitted: list[tuple[RefEvent, dict, float]] = []
    for entries in entries_by_key.values():
        ordered = sorted(entries, key=lambda e: (e.ts, e.seq))  # the backtest order
        previous: float | None = None  # aggregation at the key's previous qualifying event
        for index, current in enumerate(ordered):
            # Taken so far (this one included), with timestamp in (t - window, t].
            window = [e for e in ordered[: index + 1] if e.ts > current.ts - rule.window_ms]
            value = _aggregate(rule.aggregation_type, [e.value for e in window])
            at_or_above = value >= rule.threshold
            if len(window) == 1:
                previous = None  # the window had emptied: a new episode (docs/rule-language.md, emit_mode)
            if rule.emit_mode == "all_events":
                fire = at_or_above
            else:  # last_event: one emit per crossing observed at an event
                fire = at_or_above and (previous is None or previous < rule.threshold)
            if fire:
                emitted.append((current.event, current.obj, value))
            previous = value
    return emitted


# --------------------------------------------------------------------------- correlation


@dataclass(frozen=True)
class _ContextRecord:
    key: str
    ts: int
    seq: int
    value: Any  # the raw JSON value at context_value_field (never None)


def _context_records(rule: CorrelationRule, parsed: list[tuple[RefEvent, dict]]) -> list[_ContextRecord]:
    records = []
    for event, obj in parsed:
        if event.topic != rule.context_topic:
            continue
        key_value = get_path(obj, rule.correlation_key)
        if key_value is None:
            continue
        ts = parse_timestamp_ms(get_path(obj, rule.timestamp_field))
        if ts is None:
            continue
        value = get_path(obj, rule.context_value_field)
        if value is None:
            continue
        if rule.context_type_field is not None and not compare(
            get_path(obj, rule.context_type_field), "==", rule.context_type_value
        ):
            continue
        records.append(_ContextRecord(json_key(key_value), ts, event.seq, value))
    return records


def _correlate_one(
    rule: CorrelationRule, event: RefEvent, obj: dict, context: list[_ContextRecord]
) -> RefDetection | None:
    key_value = get_path(obj, rule.correlation_key)
    if key_value is None:
        return None
    ts = parse_timestamp_ms(get_path(obj, rule.timestamp_field))
    if ts is None:
        return None
    key = json_key(key_value)
    # All context of the key in [t - lookback, t], whatever its arrival order.
    usable = [c for c in context if c.key == key and ts - rule.lookback_ms <= c.ts <= ts]
    if not usable:
        return None

    std: float | None = None
    if rule.context_resolution == "last":
        if rule.metric != "direct":
            # CHOICE (the engine's, live and batch): for a computed metric, a record
            # without a numeric value is not context; the latest numeric one is used.
            usable = [c for c in usable if parse_number(c.value) is not None]
            if not usable:
                return None
        latest = max(usable, key=lambda c: (c.ts, c.seq))
        as_number = parse_number(latest.value)
        if as_number is not None:
            context_value: Any = as_number
        elif rule.metric == "direct":
            context_value = latest.value  # compared by JSON value (== / != only)
        else:
            return None  # a computed metric needs a numeric context value
    else:  # mean / mean_std: numeric context values only
        numbers = [n for n in (parse_number(c.value) for c in usable) if n is not None]
        if not numbers or len(numbers) < rule.min_context_points:
            return None
        mean = sum(numbers) / len(numbers)
        std = math.sqrt(sum((n - mean) ** 2 for n in numbers) / len(numbers))  # population
        context_value = mean

    if rule.metric == "direct":
        compared: Any = context_value
    else:
        assert rule.event_value_field is not None
        event_value = parse_number(get_path(obj, rule.event_value_field))
        if event_value is None:
            return None
        if rule.metric == "ratio_deviation":
            if context_value == 0:
                return None
            compared = abs(event_value / context_value - 1.0)
        elif rule.metric == "difference":
            compared = event_value - context_value
        elif rule.metric == "z_score":
            assert std is not None  # the model requires mean_std for z_score
            if std == 0:
                return None
            compared = (event_value - context_value) / std
        else:
            raise ValueError(f"unknown metric {rule.metric!r}")

    if not compare(compared, rule.condition.operator, rule.condition.value):
        return None
    # CHOICE: metric_value is the compared value as a float; under `direct` that is the
    # context value, or None when that value is not numeric.
    metric_value = parse_number(compared)
    return RefDetection(
        rule.rule_id,
        rule.version,
        event.raw,
        event.seq,
        context_value=context_value,
        metric_value=metric_value,
    )


def _evaluate_correlation(
    rule: CorrelationRule,
    parsed: list[tuple[RefEvent, dict]],
    primaries: list[tuple[RefEvent, dict]],
) -> list[RefDetection]:
    context = _context_records(rule, parsed)
    detections = []
    for event, obj in primaries:
        detection = _correlate_one(rule, event, obj, context)
        if detection is not None:
            detections.append(detection)
    return detections


# --------------------------------------------------------------------------- entry point


def evaluate(rules: list[AnyRule], events: list[RefEvent]) -> list[RefDetection]:
    """All detections of `rules` over `events`, sorted by (rule_id, seq).

    `rules` may also hold plain mappings (validated with `parse_rule`). When a rule_id
    appears more than once, the last one in the list is the one in force (a new version
    replaces the old one); disabled rules produce nothing and route nothing.
    """
    in_force: dict[str, AnyRule] = {}
    for rule in rules:
        parsed_rule = (
            rule if isinstance(rule, (ThresholdRule, VelocityRule, CorrelationRule)) else parse_rule(rule)
        )
        in_force[parsed_rule.rule_id] = parsed_rule
    active = [r for r in in_force.values() if r.enabled]

    parsed: list[tuple[RefEvent, dict]] = []
    for event in events:
        obj = parse_event(event.raw)
        if obj is not None:
            parsed.append((event, obj))

    detections: list[RefDetection] = []
    # Emits of velocity rules with emit_to_sink false, by rule_id, in emit order.
    routed: dict[str, list[tuple[RefEvent, dict]]] = {}
    for rule in active:
        if isinstance(rule, ThresholdRule):
            detections.extend(_evaluate_threshold(rule, parsed))
        elif isinstance(rule, VelocityRule):
            emitted = _evaluate_velocity(rule, parsed)
            if rule.emit_to_sink:
                detections.extend(
                    RefDetection(rule.rule_id, rule.version, event.raw, event.seq, aggregation_value=value)
                    for event, _obj, value in emitted
                )
            else:
                routed[rule.rule_id] = [(event, obj) for event, obj, _value in emitted]

    for rule in active:
        if isinstance(rule, CorrelationRule):
            if rule.velocity_filter_rule_id is not None:
                # CHOICE: only a velocity rule with emit_to_sink false routes its emits;
                # naming a sink-bound, disabled, absent or non-velocity rule gives no
                # primaries.
                primaries = routed.get(rule.velocity_filter_rule_id, [])
            else:
                primaries = [(event, obj) for event, obj in parsed if event.topic == rule.source_topic]
            detections.extend(_evaluate_correlation(rule, parsed, primaries))

    return sorted(detections, key=lambda d: (d.rule_id, d.seq))
