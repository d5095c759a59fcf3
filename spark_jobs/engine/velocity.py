"""Velocity rules in batch: sliding (per-event, not aligned) windows as range-window
functions, evaluated in the JVM.

Rules that read the same topic with the same key and clock form one group, evaluated in
one pass: one shuffle and one sort of the events by (key, time), each rule's window an
aggregate over its own qualifying rows (`CASE WHEN qualifies THEN value END`). Ten rules
grouped by user cost one sort, not ten; the event text rides along once, so emitted
rows need no join back to their events.

The window at an event at time t holds the key's qualifying events with timestamps in
(t - W, t] that were taken at or before it; equal timestamps are taken in arrival
order. A range frame on the timestamp alone would also include later events with the
same timestamp. So count, sum and avg are the difference of two prefix frames (all up
to this event in (time, arrival) order, less all at or before t - W); min, max and
distinct_count, which do not subtract, combine two frames:

  A: strictly earlier timestamps inside the window  (range frame [-(W-1), -1] in ms)
  B: the same timestamp, arrival order up to this event  (from the prefix frame)

min/max take the extreme of both; distinct_count collects [t - W + 1, t] and leaves out
the rows of time t that arrived after the event.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import reduce

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark_jobs.engine.conditions import all_conditions
from spark_jobs.engine.emits import (
    explode_matching,
    extra,
    json_member,
    json_number,
    json_string,
    matching,
    rule_table,
)
from spark_jobs.engine.values import Fields
from spark_jobs.rules.model import VelocityRule

ROUTED_COLUMNS = ["topic", "seq", "raw", "v", "proc_ms", "ts_ms"]


@dataclass
class VelocityOutput:
    emits: DataFrame | None  # EMIT_COLUMNS of the rules that emit to the sink
    routed: dict[str, DataFrame]  # rule id -> ROUTED_COLUMNS, rules with emit_to_sink false
    dead: list[DataFrame]


def _group_key(rule: VelocityRule) -> tuple[str, str | None, str | None]:
    return rule.source_topic, rule.group_by, rule.timestamp_field if rule.uses_event_time else None


def _value(rule: VelocityRule, fields: Fields) -> Column:
    """What the rule aggregates; NULL when the event lacks it (the event then does not
    enter the window). count needs no value, but a named aggregation_field must exist."""
    path = rule.aggregation_field
    if rule.aggregation_type == "count":
        return F.when(fields.value(path).present, F.lit("")) if path else F.lit("")
    if rule.aggregation_type == "distinct_count":
        return fields.value(path).json
    return fields.value(path).num


def _time(rule: VelocityRule, fields: Fields) -> Column:
    return fields.time(rule.timestamp_field) if rule.uses_event_time else F.col("proc_ms")


def _entered(
    events: DataFrame, rules: list[VelocityRule], fields: Fields, timed: bool = True
) -> tuple[DataFrame, list[Column]]:
    """The group's events that enter at least one rule's window: k, ts_ms, one `_q{i}`
    (enters rule i) and `_x{i}` (its value) per rule. `timed`: only those with a usable
    timestamp (the others are `_dead`)."""
    first = rules[0]
    v = F.col("v")
    topic_events = events.filter(F.col("topic") == first.source_topic)
    cols: list[Column] = []
    for i, r in enumerate(rules):
        x = _value(r, fields)
        cols += [(all_conditions(v, r.conditions, fields.values) & x.isNotNull()).alias(f"_q{i}"), x.alias(f"_x{i}")]
    base = topic_events.select(
        "topic", "seq", "raw", "proc_ms", fields.key(first.group_by).alias("k"), _time(first, fields).alias("ts_ms"),
        *cols,
    )
    q = [F.col(f"_q{i}") for i in range(len(rules))]
    base = base.filter(F.col("k").isNotNull() & reduce(lambda a, b: a | b, q))
    return (base.filter(F.col("ts_ms").isNotNull()) if timed else base), q


def _dead(events: DataFrame, rules: list[VelocityRule], fields: Fields) -> DataFrame:
    """Events that enter a rule of the group but have no usable timestamp: relevant, but
    they cannot be placed in time. The timestamp test runs first, so the rules'
    conditions are evaluated only for the (normally few) events without one."""
    first = rules[0]
    untimed = events.filter((F.col("topic") == first.source_topic) & _time(first, fields).isNull())
    entered, q = _entered(untimed, rules, fields, timed=False)
    ids = F.array(*[F.lit(r.rule_id) for r in rules])
    what = f"timestamp field {first.timestamp_field!r}" if first.uses_event_time else "processing time"
    return explode_matching(entered, matching(q), ["topic", "seq", "raw"]).select(
        "topic", "seq", "raw", F.lit(f"missing or unparseable {what} needed by velocity rule").alias("reason"),
        F.element_at(ids, F.col("_i") + 1).alias("rule_id"),
    )


def _aggregate(i: int, rule: VelocityRule) -> Column:
    """Rule i's aggregation over its window at each event (meaningful where `_q{i}`)."""
    w_ms = rule.window_ms
    by_time = Window.partitionBy("k").orderBy("ts_ms")
    # Everything up to this event in (time, arrival) order.
    prefix = Window.partitionBy("k").orderBy("ts_ms", "seq").rowsBetween(Window.unboundedPreceding, 0)
    val = F.when(F.col(f"_q{i}"), F.col(f"_x{i}"))
    one = F.when(F.col(f"_q{i}"), F.lit(1))
    kind = rule.aggregation_type

    def in_window(agg: Column) -> Column:
        """agg over the window: everything up to this event in (time, arrival) order,
        less everything at or before t - W.

        Spark re-aggregates a sliding frame from scratch whenever it moves (O(n * w)),
        which is quadratic for a busy key; both frames here are prefix frames, which
        Spark computes incrementally: O(n). Sums use DECIMAL so the difference is exact.
        """
        upto_me = agg.over(prefix)
        upto_low = agg.over(by_time.rangeBetween(Window.unboundedPreceding, -w_ms))
        return F.coalesce(upto_me, F.lit(0)) - F.coalesce(upto_low, F.lit(0))

    exact = val.try_cast("decimal(38,12)")
    if kind == "count":
        return in_window(F.count(one)).cast("double")
    if kind == "sum":
        return in_window(F.sum(exact)).cast("double")
    if kind == "avg":
        # A row that does not enter this rule may see an empty window: NULL, not an error.
        # The exact sum rounded once to a double, then divided in double: what the live
        # job computes (math.fsum / n). DECIMAL division would round to its own scale.
        return F.try_divide(in_window(F.sum(exact)).cast("double"), in_window(F.count(val)).cast("double"))
    # min, max and distinct_count do not subtract. A: a sliding range frame over the
    # strictly earlier timestamps inside the window. B (this timestamp, arrival order up
    # to this event) from the prefix frame the sums use: the greatest (ts_ms, value) of
    # the prefix has this event's timestamp (the rows come in time order), and among
    # equal timestamps the extreme value. A frame per (key, timestamp) would do the
    # same as a third window operator, over partitions of mostly one row.
    sliding = by_time.rangeBetween(-(w_ms - 1), -1) if w_ms > 1 else None

    def over_a(a: Column, empty: Column) -> Column:
        return a.over(sliding) if sliding is not None else empty

    if kind == "max":
        # NULL sorts first in a struct: a value wins over none.
        same_ts = F.max(F.struct(F.col("ts_ms").alias("t"), val.alias("x"))).over(prefix)["x"]
        return F.greatest(over_a(F.max(val), F.lit(None).cast("double")), same_ts)
    if kind == "min":
        # The earliest (-ts_ms), then a value before none, then the smallest value.
        first = F.struct((-F.col("ts_ms")).alias("t"), val.isNull().alias("n"), val.alias("x"))
        return F.least(over_a(F.min(val), F.lit(None).cast("double")), F.min(first).over(prefix)["x"])
    if kind == "distinct_count":
        # A and B in one range frame [t - W + 1, t]: its rows of this timestamp that
        # arrived after this event are filtered out before counting.
        taken = F.collect_list(F.when(F.col(f"_q{i}"), F.struct(F.col("ts_ms").alias("t"), F.col("seq").alias("s"),
                                                               val.alias("x"))))
        frame = taken.over(by_time.rangeBetween(-(w_ms - 1), 0))
        mine = F.filter(frame, lambda e: (e["t"] < F.col("ts_ms")) | (e["s"] <= F.col("seq")))
        return F.size(F.array_distinct(F.transform(mine, lambda e: e["x"]))).cast("double")
    raise ValueError(kind)  # pragma: no cover - the model rejects other values


def _fires(i: int, rule: VelocityRule) -> Column:
    """Whether rule i emits at this event, per its emit_mode. `last_event` compares with
    the aggregation at the key's previous event that entered this rule, while that event
    is in this one's window: once the window has emptied, the key starts a new episode
    (the live job has dropped the key's state by then; README, "last_event")."""
    agg, q = F.col(f"_a{i}"), F.col(f"_q{i}")
    above = q & (agg >= F.lit(float(rule.threshold)))
    if rule.emit_mode == "all_events":
        return above
    before = Window.partitionBy("k").orderBy("ts_ms", "seq").rowsBetween(Window.unboundedPreceding, -1)
    prev = F.last(F.when(q, agg), ignorenulls=True).over(before)
    prev_ts = F.last(F.when(q, F.col("ts_ms")), ignorenulls=True).over(before)
    new_episode = prev.isNull() | (prev_ts <= F.col("ts_ms") - F.lit(rule.window_ms))
    return above & (new_episode | (prev < F.lit(float(rule.threshold))))


def _fired(events: DataFrame, rules: list[VelocityRule], fields: Fields) -> DataFrame:
    """Fired rows of one group: the event columns plus `_i` (index of the rule that
    fired) and `agg`."""
    entered, _ = _entered(events, rules, fields)
    # One shuffle and one sort serve every window below: each Window's required
    # distribution (by k) and ordering (k, ts_ms[, seq]) is already met.
    ordered = entered.repartition("k").sortWithinPartitions("k", "ts_ms", "seq")
    with_aggs = ordered.select("*", *[_aggregate(i, r).alias(f"_a{i}") for i, r in enumerate(rules)])
    fired = matching([_fires(i, r) for i, r in enumerate(rules)])
    aggs = F.array(*[F.col(f"_a{i}") for i in range(len(rules))])
    # Window functions may not sit under a generator: the matches first, then explode.
    keep = ["topic", "seq", "raw", "proc_ms", "ts_ms"]
    fired_rows = with_aggs.select(*keep, fired.alias("_fired"), aggs.alias("_aggs"))
    out = explode_matching(fired_rows, F.col("_fired"), [*keep, "_aggs"])
    return out.select(*keep, "_i", F.element_at("_aggs", F.col("_i") + 1).alias("agg"))


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
                out.routed[r.rule_id] = fired.filter(F.col("_i") == i).select(
                    "topic", "seq", "raw", F.parse_json("raw").alias("v"), "proc_ms", "ts_ms"
                )
        sink = [i for i, r in enumerate(rs) if r.emit_to_sink]
        if not sink:
            continue
        meta = rule_table(rs, agg_type=[r.aggregation_type for r in rs])
        m = F.element_at(meta, F.col("_i") + 1)
        emitted = fired.filter(F.col("_i").isin(sink)) if len(sink) < len(rs) else fired
        emits.append(emitted.select(
            *[m[c].alias(c) for c in ("rule_id", "rule_version", "rule_type", "rule_name")],
            "topic", "seq", "ts_ms", "raw",
            velocity_members(m["agg_type"], F.col("agg")).alias("extra"),
            m["head"].alias("head"),
        ))
    out.emits = reduce(lambda a, b: a.unionByName(b), emits) if emits else None
    return out


def velocity_members(agg_type: Column, agg: Column) -> Column:
    """The velocity members of a detection; shared with the live job."""
    value = F.when(agg_type.isin("count", "distinct_count"), json_number(agg.cast("long"))).otherwise(json_number(agg))
    return extra(
        json_member("aggregation_type", json_string(agg_type)),
        json_member("aggregation_value", value),
    )
