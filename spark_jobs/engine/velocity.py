"""Velocity rules in batch: sliding (per-event, not aligned) windows as range-window
functions, evaluated in the JVM.

The window at an event at time t holds the key's qualifying events with timestamps in
(t - W, t] that were taken at or before it; equal timestamps are taken in arrival
order. A range frame on the timestamp alone would also include later events with the
same timestamp, so each aggregate combines two frames:

  A: strictly earlier timestamps inside the window  (range frame [-(W-1), -1] in ms)
  B: the same timestamp, arrival order up to this event  (rows frame per (key, ts))

count/sum add, min/max take the extreme of both, avg is sum/count and distinct_count
is the size of the union of the two value sets.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark_jobs.engine.conditions import all_conditions
from spark_jobs.engine.emits import extra, json_member, json_number, json_string, select_emits
from spark_jobs.engine.events import dead_letters
from spark_jobs.engine.values import as_number as _as_number
from spark_jobs.engine.values import field, field_key, field_timestamp_ms, json_text, with_field_values
from spark_jobs.rules.model import VelocityRule

ROUTED_COLUMNS = ["topic", "seq", "raw", "v", "proc_ms", "ts_ms"]


@dataclass
class VelocityOutput:
    emits: DataFrame  # EMIT_COLUMNS; empty of rows when emit_to_sink is false
    routed: DataFrame | None  # ROUTED_COLUMNS, the emitted events when emit_to_sink is false
    dead: DataFrame


def qualifying(events: DataFrame, rule: VelocityRule) -> tuple[DataFrame, DataFrame]:
    """Events that enter this rule's window, with k (key), ts, val; and the dead letters.

    An event enters when it passes the pre-filter and has the group value and (for all
    but count) the aggregation value. Such an event without a usable timestamp is a
    dead letter for this rule: it is relevant, but cannot be placed in time.
    """
    v = F.col("v")
    if rule.aggregation_type == "count":
        # count needs no value, but a named aggregation_field must still be present.
        val: Column = json_text(field(v, rule.aggregation_field)) if rule.aggregation_field else F.lit("")
    elif rule.aggregation_type == "distinct_count":
        val = json_text(field(v, rule.aggregation_field))
    else:
        val = _as_number(field(v, rule.aggregation_field))
    ts = field_timestamp_ms(v, rule.timestamp_field) if rule.uses_event_time else F.col("proc_ms")
    topic_events, values = with_field_values(
        events.filter(F.col("topic") == rule.source_topic), v, (c.field for c in rule.conditions)
    )
    base = topic_events.filter(all_conditions(v, rule.conditions, values)).select(
        "topic", "seq", "raw", "v", "proc_ms",
        field_key(v, rule.group_by).alias("k"),
        ts.alias("ts_ms"),
        val.alias("val"),
    )
    base = base.filter(F.col("k").isNotNull() & F.col("val").isNotNull())
    what = f"timestamp field {rule.timestamp_field!r}" if rule.uses_event_time else "processing time"
    dead = dead_letters(
        base.filter(F.col("ts_ms").isNull()),
        F.lit(f"missing or unparseable {what} needed by velocity rule"),
        rule.rule_id,
    )
    return base.filter(F.col("ts_ms").isNotNull()), dead


def window_aggregate(df: DataFrame, rule: VelocityRule) -> DataFrame:
    """Adds `agg`: the rule's aggregation over the window at each event."""
    w_ms = rule.window_ms
    by_time = Window.partitionBy("k").orderBy("ts_ms")
    same_ts = Window.partitionBy("k", "ts_ms").orderBy("seq").rowsBetween(Window.unboundedPreceding, 0)
    val = F.col("val")
    kind = rule.aggregation_type

    def earlier(agg: Column) -> Column:
        """agg over frame A, i.e. timestamps in [t - W + 1, t - 1].

        Spark re-aggregates a sliding frame from scratch whenever it moves (O(n * w)),
        which is quadratic for a busy key. For count and sum the frame is instead the
        difference of two prefix frames (unbounded preceding up to t-1 and up to t-W),
        which Spark computes incrementally: O(n). Sums use DECIMAL so the difference
        is exact.
        """
        upto_prev = agg.over(by_time.rangeBetween(Window.unboundedPreceding, -1))
        upto_low = agg.over(by_time.rangeBetween(Window.unboundedPreceding, -w_ms))
        return F.coalesce(upto_prev, F.lit(0)) - F.coalesce(upto_low, F.lit(0))

    exact = val.try_cast("decimal(38,12)")
    if kind == "count":
        agg = (earlier(F.count(F.lit(1))) + F.count(F.lit(1)).over(same_ts)).cast("double")
    elif kind == "sum":
        agg = (earlier(F.sum(exact)) + F.sum(exact).over(same_ts)).cast("double")
    elif kind == "avg":
        s = earlier(F.sum(exact)) + F.sum(exact).over(same_ts)
        n = earlier(F.count(val)) + F.count(val).over(same_ts)
        agg = (s / n).cast("double")
    else:
        # min, max and distinct_count do not subtract: a sliding range frame it is.
        sliding = by_time.rangeBetween(-(w_ms - 1), -1) if w_ms > 1 else None

        def over_a(a: Column, empty: Column) -> Column:
            return a.over(sliding) if sliding is not None else empty

        if kind == "min":
            agg = F.least(over_a(F.min(val), F.lit(None).cast("double")), F.min(val).over(same_ts))
        elif kind == "max":
            agg = F.greatest(over_a(F.max(val), F.lit(None).cast("double")), F.max(val).over(same_ts))
        elif kind == "distinct_count":
            none = F.array().cast("array<string>")
            a = F.coalesce(over_a(F.collect_set(val), none), none)
            agg = F.size(F.array_union(a, F.collect_set(val).over(same_ts))).cast("double")
        else:  # pragma: no cover - the model rejects other values
            raise ValueError(kind)
    return df.withColumn("agg", agg)


def crossings(df: DataFrame, rule: VelocityRule) -> DataFrame:
    """Rows at which the rule emits, per its emit_mode."""
    above = F.col("agg") >= F.lit(float(rule.threshold))
    if rule.emit_mode == "all_events":
        return df.filter(above)
    prev = F.lag("agg").over(Window.partitionBy("k").orderBy("ts_ms", "seq"))
    return df.withColumn("_prev", prev).filter(
        above & (F.col("_prev").isNull() | (F.col("_prev") < F.lit(float(rule.threshold))))
    )


def velocity_members(agg_type: Column, agg: Column) -> Column:
    """The velocity members of a detection; shared with the live job."""
    value = F.when(agg_type.isin("count", "distinct_count"), json_number(agg.cast("long"))).otherwise(json_number(agg))
    return extra(
        json_member("aggregation_type", json_string(agg_type)),
        json_member("aggregation_value", value),
    )


def velocity_extra(rule: VelocityRule) -> Column:
    return velocity_members(F.lit(rule.aggregation_type), F.col("agg"))


def velocity_rule(events: DataFrame, rule: VelocityRule) -> VelocityOutput:
    entered, dead = qualifying(events, rule)
    emitted = crossings(window_aggregate(entered, rule), rule)
    emits = select_emits(emitted, rule, F.col("ts_ms"), velocity_extra(rule))
    if rule.emit_to_sink:
        return VelocityOutput(emits, None, dead)
    return VelocityOutput(emits.limit(0), emitted.select(*ROUTED_COLUMNS), dead)
