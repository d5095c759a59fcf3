"""Velocity rules in batch: sliding (per-event, not aligned) windows, evaluated by the
live job's own window code in the JVM.

Rules that read the same topic with the same key and clock form one group, evaluated in
one pass: one shuffle and one sort of the events by (key, time, arrival), then
`BatchVelocity` (spark_jobs/jvm/processor) slides a window per key and rule over the
sorted rows with `Velocity.Window`, the live job's aggregation (exact sums, monotonic
deques for min/max, value counts for distinct_count) and its emit rule: O(1) amortized
per entered event. The event text rides along once, so emitted rows need no join back
to their events. Ten rules grouped by user cost one sort, not ten.

The window at an event at time t holds the key's qualifying events with timestamps in
(t - W, t] that were taken at or before it; equal timestamps are taken in arrival order
(docs/rule-language.md, "Velocity rules"). A classic session calls the pass through
Py4J, a Spark Connect client through the server's relation plugin (`jvm_pass`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.engine.conditions import all_conditions
from spark_jobs.engine.emits import (
    explode_matching,
    extra,
    json_member,
    json_number,
    json_string,
    matching,
    rule_emits,
    rule_table,
)
from spark_jobs.engine.frames import union_all
from spark_jobs.engine.jvm_pass import run_pass
from spark_jobs.engine.values import Fields
from spark_jobs.rules.model import VelocityRule

ROUTED_COLUMNS = ["topic", "seq", "raw", "v", "proc_ms", "ts_ms"]


@dataclass
class VelocityOutput:
    # EMIT_COLUMNS of the rules that emit to the sink, and `reason`: where set, no
    # detection but a dead letter (pipeline.EngineResult.evaluated)
    emits: DataFrame | None
    routed: dict[str, DataFrame]  # rule id -> ROUTED_COLUMNS, rules with emit_to_sink false
    dead: list[DataFrame]


def _group_key(rule: VelocityRule) -> tuple[str, str | None, str | None]:
    return rule.source_topic, rule.group_by, rule.timestamp_field if rule.uses_event_time else None


def _value_key(rule: VelocityRule) -> tuple[str, str | None]:
    """Rules with equal keys aggregate the same value (see `_value`)."""
    kind = {"count": "count", "distinct_count": "json"}.get(rule.aggregation_type, "num")
    return kind, rule.aggregation_field


def _value(rule: VelocityRule, fields: Fields) -> Column:
    """What the rule aggregates; NULL when the event lacks it (the event then does not
    enter the window). count needs no value, but a named aggregation_field must exist."""
    kind, path = _value_key(rule)
    if kind == "count":
        return F.when(fields.value(path).present, F.lit("")) if path else F.lit("")
    if kind == "json":
        return fields.value(path).json
    return fields.value(path).num


def _time(rule: VelocityRule, fields: Fields) -> Column:
    return fields.time(rule.timestamp_field) if rule.uses_event_time else F.col("proc_ms")


@dataclass(frozen=True)
class _Input:
    """A rule's columns in its group: `q` (the event enters its window), `x` (the value
    it aggregates). Rules with the same conditions and value share them."""

    q: str
    x: str


def _entered(
    events: DataFrame, rules: list[VelocityRule], fields: Fields, timed: bool = True
) -> tuple[DataFrame, list[_Input]]:
    """The group's events that enter at least one rule's window: k, ts_ms, and the
    rules' `_Input` columns: an `x` per distinct value, a `q` per distinct (value,
    conditions), not one of each per rule, for the rows carry them through every window
    operator. `timed`: only those with a usable timestamp (the others are `_dead`)."""
    first = rules[0]
    v = F.col("v")
    topic_events = events.filter(F.col("topic") == first.source_topic)
    values: dict[tuple, tuple[str, Column]] = {}
    entries: dict[tuple, str] = {}
    cols: list[Column] = []
    inputs: list[_Input] = []
    for r in rules:
        vkey = _value_key(r)
        if vkey not in values:
            name, value = f"_x{len(values)}", _value(r, fields)
            values[vkey] = (name, value)
            cols.append(value.alias(name))
        x, value = values[vkey]
        qkey = (vkey, tuple(json.dumps(c.model_dump(mode="json"), sort_keys=True) for c in r.conditions))
        if qkey not in entries:
            entries[qkey] = f"_q{len(entries)}"
            cols.append((all_conditions(v, r.conditions, fields.values) & value.isNotNull()).alias(entries[qkey]))
        inputs.append(_Input(entries[qkey], x))
    base = topic_events.select(
        "topic", "seq", "raw", "proc_ms", fields.key(first.group_by).alias("k"), _time(first, fields).alias("ts_ms"),
        *cols,
    )
    q = [F.col(name) for name in entries.values()]
    base = base.filter(F.col("k").isNotNull() & reduce(lambda a, b: a | b, q))
    return (base.filter(F.col("ts_ms").isNotNull()) if timed else base), inputs


def _dead(events: DataFrame, rules: list[VelocityRule], fields: Fields) -> DataFrame:
    """Events that enter a rule of the group but have no usable timestamp: relevant, but
    they cannot be placed in time. The timestamp test runs first, so the rules'
    conditions are evaluated only for the (normally few) events without one."""
    first = rules[0]
    untimed = events.filter((F.col("topic") == first.source_topic) & _time(first, fields).isNull())
    entered, inputs = _entered(untimed, rules, fields, timed=False)
    ids = F.array(*[F.lit(r.rule_id) for r in rules])
    what = f"timestamp field '{first.timestamp_field}'" if first.uses_event_time else "processing time"
    return explode_matching(entered, matching([F.col(i.q) for i in inputs]), ["topic", "seq", "raw"]).select(
        "topic", "seq", "raw", F.lit(f"missing or unparseable {what} needed by velocity rule").alias("reason"),
        F.element_at(ids, F.col("_i") + 1).alias("rule_id"),
    )


def _fired(events: DataFrame, rules: list[VelocityRule], fields: Fields) -> DataFrame:
    """Fired rows of one group: the event columns plus `_i` (index of the rule that
    fired), `agg`, and `reason`: where set, the rule could not be evaluated at the event
    (a dead letter, as live: an exact sum beyond the double range)."""
    entered, inputs = _entered(events, rules, fields)
    spec = {"rules": [
        {"q": inp.q, "x": inp.x, "aggregation_type": r.aggregation_type, "window_ms": r.window_ms,
         "threshold": float(r.threshold), "all_events": r.emit_mode == "all_events"}
        for r, inp in zip(rules, inputs, strict=True)
    ]}
    columns = ["topic", "seq", "raw", "proc_ms", "k", "ts_ms", *dict.fromkeys(c for i in inputs for c in (i.q, i.x))]
    return run_pass(entered.select(*columns), "velocity", json.dumps(spec, allow_nan=False))


def velocity_rules(events: DataFrame, rules: list[VelocityRule], fields: Fields) -> VelocityOutput:
    groups: dict[tuple, list[VelocityRule]] = defaultdict(list)
    for r in rules:
        groups[_group_key(r)].append(r)
    out = VelocityOutput(emits=None, routed={}, dead=[])
    emits: list[DataFrame] = []
    for _, rs in sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        fired = _fired(events, rs, fields)
        out.dead.append(_dead(events, rs, fields))
        for i, r in enumerate(rs):
            if not r.emit_to_sink:
                out.routed[r.rule_id] = fired.filter((F.col("_i") == i) & F.col("reason").isNull()).select(
                    "topic", "seq", "raw", F.parse_json("raw").alias("v"), "proc_ms", "ts_ms"
                )
        sink = [i for i, r in enumerate(rs) if r.emit_to_sink]
        if not sink:
            continue
        meta = rule_table(rs, agg_type=[r.aggregation_type for r in rs])
        m = F.element_at(meta, F.col("_i") + 1)
        emitted = fired.filter(F.col("_i").isin(sink)) if len(sink) < len(rs) else fired
        emits.append(rule_emits(emitted, m, F.col("ts_ms"), velocity_members(m["agg_type"], F.col("agg")), "reason"))
    out.emits = union_all(emits) if emits else None
    return out


def velocity_members(agg_type: Column, agg: Column) -> Column:
    """The velocity members of a detection; shared with the live job."""
    value = F.when(agg_type.isin("count", "distinct_count"), json_number(agg.cast("long"))).otherwise(json_number(agg))
    return extra(
        json_member("aggregation_type", json_string(agg_type)),
        json_member("aggregation_value", value),
    )
