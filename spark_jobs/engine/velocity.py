"""Velocity rules in batch: sliding (per-event, not aligned) windows, evaluated by the
live job's own window code in the JVM.

Rules that read the same topic with the same key and clock form a group. Each event
becomes one entry per group it enters (one generator over one projection), and all
groups go through one pass: one shuffle and one sort of the entries by (group, key,
time, arrival), then `BatchVelocity` (spark_jobs/jvm/processor) slides a window per key
and rule over the sorted rows with `Velocity.Window`, the live job's aggregation (exact
sums, monotonic deques for min/max, value counts for distinct_count) and its emit rule:
O(1) amortized per entered event. The event text rides along once, so emitted rows need
no join back to their events. The plan's size does not grow with the number of groups
or topics: ten rules grouped by user cost one sort, and so do ten groups.

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
from spark_jobs.engine.emits import extra, json_member, json_number, json_string, rule_table
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
    """Where a rule reads, in its group's entry: `q` (index of the test that the event
    enters its window) and `x` (index of the value it aggregates, in the numbers or the
    texts). Rules with the same conditions and value share them."""

    q: int
    x: int


def _entry(rules: list[VelocityRule], fields: Fields, g: int) -> tuple[Column, list[_Input]]:
    """The group's entry for an event (NULL when it enters none of the group's windows):
    g, k, ts_ms (NULL without a usable time), and arrays `q` (an entry test per distinct
    (value, conditions)), `xn` and `xj` (a number or text per distinct value), not one
    of each per rule, for the entries carry them through the shuffle and the sort."""
    first = rules[0]
    v = F.col("v")
    nums: dict[tuple, Column] = {}
    texts: dict[tuple, Column] = {}
    tests: dict[tuple, Column] = {}
    inputs: list[_Input] = []
    for r in rules:
        vkey = _value_key(r)
        value = _value(r, fields)
        bucket = nums if vkey[0] == "num" else texts
        if vkey not in bucket:
            bucket[vkey] = value
        qkey = (vkey, tuple(json.dumps(c.model_dump(mode="json"), sort_keys=True) for c in r.conditions))
        if qkey not in tests:
            tests[qkey] = all_conditions(v, r.conditions, fields.values) & value.isNotNull()
        inputs.append(_Input(list(tests).index(qkey), list(bucket).index(vkey)))
    key = fields.key(first.group_by)
    entry = F.struct(
        F.lit(g).alias("g"), key.alias("k"), _time(first, fields).alias("ts_ms"),
        F.array(*tests.values()).alias("q"),
        F.array(*nums.values()).cast("array<double>").alias("xn"),
        F.array(*texts.values()).cast("array<string>").alias("xj"),
    )
    enters = (F.col("topic") == F.lit(first.source_topic)) & key.isNotNull() & reduce(
        lambda a, b: a | b, [F.coalesce(t, F.lit(False)) for t in tests.values()])
    return F.when(enters, entry), inputs


def _fired(events: DataFrame, groups: list[list[VelocityRule]], fields: Fields) -> DataFrame:
    """Fired rows of every group in one pass: the event columns plus `_i` (index of the
    rule that fired, the groups' rules taken in order), `agg`, and `reason`: where set,
    the rule could not be evaluated at the event (a dead letter, as live: an exact sum
    beyond the double range; or the event has no usable time, `ts_ms` then NULL)."""
    entries: list[Column] = []
    spec: list[dict] = []
    for g, rules in enumerate(groups):
        entry, inputs = _entry(rules, fields, g)
        entries.append(entry)
        first = rules[0]
        what = f"timestamp field '{first.timestamp_field}'" if first.uses_event_time else "processing time"
        spec.append({"untimed": f"missing or unparseable {what} needed by velocity rule", "rules": [
            {"q": inp.q, "x": inp.x, "aggregation_type": r.aggregation_type, "window_ms": r.window_ms,
             "threshold": float(r.threshold), "all_events": r.emit_mode == "all_events"}
            for r, inp in zip(rules, inputs, strict=True)
        ]})
    # One generator over every group's entry: an event meets each group once, in one
    # projection (the filter after the generator cannot be pushed below it).
    entered = (events.select("topic", "seq", "raw", "proc_ms", F.explode(F.array(*entries)).alias("_e"))
               .filter(F.col("_e").isNotNull())
               .select("topic", "seq", "raw", "proc_ms", "_e.*"))
    return run_pass(entered, "velocity", json.dumps({"groups": spec}, allow_nan=False))


def velocity_rules(events: DataFrame, rules: list[VelocityRule], fields: Fields) -> VelocityOutput:
    by_group: dict[tuple, list[VelocityRule]] = defaultdict(list)
    for r in rules:
        by_group[_group_key(r)].append(r)
    groups = [rs for _, rs in sorted(by_group.items(), key=lambda kv: tuple(str(x) for x in kv[0]))]
    out = VelocityOutput(emits=None, routed={}, dead=[])
    if not groups:
        return out
    ordered = [r for rs in groups for r in rs]
    fired = _fired(events, groups, fields)
    meta = rule_table(ordered, agg_type=[r.aggregation_type for r in ordered])
    m = F.element_at(meta, F.col("_i") + 1)
    untimed = F.col("ts_ms").isNull()
    out.dead.append(fired.filter(untimed).select("topic", "seq", "raw", "reason", m["rule_id"].alias("rule_id")))
    for i, r in enumerate(ordered):
        if not r.emit_to_sink:
            out.routed[r.rule_id] = fired.filter((F.col("_i") == i) & F.col("reason").isNull()).select(
                "topic", "seq", "raw", F.parse_json("raw").alias("v"), "proc_ms", "ts_ms"
            )
    sink = [i for i, r in enumerate(ordered) if r.emit_to_sink]
    if sink:
        emitted = fired.filter(~untimed & (F.col("_i").isin(sink) if len(sink) < len(ordered) else F.lit(True)))
        out.emits = emitted.select(
            *[m[c].alias(c) for c in ("rule_id", "rule_version", "rule_type", "rule_name")],
            "topic", "seq", "ts_ms", "raw",
            velocity_members(m["agg_type"], F.col("agg")).alias("extra"),
            m["head"].alias("head"),
            "reason",
        )
    return out


def velocity_members(agg_type: Column, agg: Column) -> Column:
    """The velocity members of a detection; shared with the live job."""
    value = F.when(agg_type.isin("count", "distinct_count"), json_number(agg.cast("long"))).otherwise(json_number(agg))
    return extra(
        json_member("aggregation_type", json_string(agg_type)),
        json_member("aggregation_value", value),
    )
