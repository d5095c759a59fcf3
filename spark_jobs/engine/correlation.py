"""Correlation rules in batch: primaries judged against context for the same key.

Primaries and context records are unioned per (rule, key) and ordered by time; one
range frame [t - lookback, t] per primary yields the latest context (`last`, as the
max of (ts, seq, value) structs) or the mean/std/count. Because the backtest sees all
context regardless of arrival order, a primary that arrived before its context is
judged against it, which is what the live job reaches by holding such primaries.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark_jobs.engine.conditions import compare
from spark_jobs.engine.emits import extra, json_member, json_number, json_string, select_emits
from spark_jobs.engine.events import dead_letters
from spark_jobs.engine.values import Fields
from spark_jobs.rules.model import CorrelationRule

_ORDER = {">": "__gt__", "<": "__lt__", ">=": "__ge__", "<=": "__le__", "==": "__eq__", "!=": "__ne__"}


@dataclass
class CorrelationOutput:
    emits: DataFrame
    dead: DataFrame
    primaries: DataFrame  # counted for the summary ("events evaluated")


def _primaries(source: DataFrame, rule: CorrelationRule, fields: Fields) -> tuple[DataFrame, DataFrame]:
    ev_val = fields.value(rule.event_value_field).num if rule.event_value_field else F.lit(None).cast("double")
    p = source.select(
        "topic", "seq", "raw",
        fields.key(rule.correlation_key).alias("k"),
        fields.time(rule.timestamp_field).alias("ts_ms"),
        ev_val.alias("ev"),
    ).filter(F.col("k").isNotNull())
    dead = dead_letters(
        p.filter(F.col("ts_ms").isNull()),
        F.lit(f"missing or unparseable timestamp field {rule.timestamp_field!r} needed by correlation rule"),
        rule.rule_id,
    )
    return p.filter(F.col("ts_ms").isNotNull()), dead


def _context(events: DataFrame, rule: CorrelationRule, fields: Fields) -> DataFrame:
    c = events.filter(F.col("topic") == rule.context_topic)
    if rule.context_type_field is not None:
        c = c.filter(compare(fields.value(rule.context_type_field), "==", rule.context_type_value))
    cval = fields.value(rule.context_value_field)
    c = c.select(
        "seq",
        fields.key(rule.correlation_key).alias("k"),
        fields.time(rule.timestamp_field).alias("ts_ms"),
        cval.num.alias("cnum"),
        cval.json.alias("cjson"),
        F.col("raw").alias("craw"),
    ).filter(F.col("k").isNotNull() & F.col("ts_ms").isNotNull() & F.col("cjson").isNotNull())
    if rule.context_resolution != "last" or rule.metric != "direct":
        c = c.filter(F.col("cnum").isNotNull())
    return c


def _resolve(union: DataFrame, ctx: DataFrame, rule: CorrelationRule) -> DataFrame:
    """Context per primary over [t - lookback, t] (`ctx`: the rule's context records,
    also in `union`).

    Spark re-aggregates a sliding frame from scratch whenever it moves, O(n * frame);
    so the latest context is a running `last` (incremental) checked against the
    lookback, and the mean's sum and count are differences of two prefix frames
    (incremental, DECIMAL so the difference is exact). Only the population std keeps
    a sliding frame (a difference of sums of squares would not be exact), over far
    fewer rows than the primaries (`_std`).
    """
    lb = rule.lookback_ms
    is_ctx = F.col("is_ctx")
    if rule.context_resolution == "last":
        # Context at the primary's own timestamp counts ("at or before"): contexts sort
        # before primaries of the same timestamp.
        running = Window.partitionBy("k").orderBy("ts_ms", F.col("is_ctx").desc(), "seq").rowsBetween(
            Window.unboundedPreceding, 0
        )
        latest = F.last(F.when(is_ctx, F.struct("ts_ms", "seq", "cnum", "cjson", "craw")), ignorenulls=True).over(running)
        out = union.withColumn("_c", latest)
        usable = F.col("_c").isNotNull() & (F.col("_c.ts_ms") >= F.col("ts_ms") - F.lit(lb))
        return out.select(
            "*",
            F.col("_c.cnum").alias("ctx_num"),
            F.col("_c.cjson").alias("ctx_json"),
            F.col("_c.craw").alias("ctx_record"),
            usable.alias("has_ctx"),
        )
    by_time = Window.partitionBy("k").orderBy("ts_ms")
    upto_t = by_time.rangeBetween(Window.unboundedPreceding, 0)
    before_lb = by_time.rangeBetween(Window.unboundedPreceding, -(lb + 1))
    cval = F.when(is_ctx, F.col("cnum"))
    exact = cval.try_cast("decimal(38,12)")

    def in_frame(agg: Column) -> Column:
        return F.coalesce(agg.over(upto_t), F.lit(0)) - F.coalesce(agg.over(before_lb), F.lit(0))

    # The context in a primary's frame is a run of the key's context records in time
    # order: those after the first `_lo` up to the first `_hi`.
    hi = F.coalesce(F.count(cval).over(upto_t), F.lit(0))
    lo = F.coalesce(F.count(cval).over(before_lb), F.lit(0))
    out = union.select("*", hi.alias("_hi"), lo.alias("_lo"), in_frame(F.sum(exact)).alias("_sum"))
    n = F.col("_hi") - F.col("_lo")
    # The exact sum rounded once to a double, then divided in double, as the live job
    # does (math.fsum / n); a DECIMAL division would round to its own scale.
    out = out.select("*", n.alias("ctx_count"),
                     F.when(n > 0, F.col("_sum").cast("double") / n.cast("double")).alias("ctx_num"))
    # docs/rule-language.md ("The detection record"): under `mean` and `mean_std` alike
    # the detection's context is
    # {mean, std, count} (the live job renders the same), so the std is computed for both.
    out = out.join(_std(ctx, lb), ["k", "_lo", "_hi"], "left")
    record = F.to_json(F.struct(F.col("ctx_num").alias("mean"), F.col("ctx_std").alias("std"), F.col("ctx_count").alias("count")))
    return out.select(
        "*",
        json_number(F.col("ctx_num")).alias("ctx_json"),
        record.alias("ctx_record"),
        ((F.col("ctx_count") >= F.lit(rule.min_context_points)) & (F.col("ctx_count") > 0)).alias("has_ctx"),
    )


def _std(ctx: DataFrame, lookback_ms: int) -> DataFrame:
    """Population std of every context run (k, _lo, _hi) a primary can see, from the
    context records alone.

    A primary at t sees the key's context records after the first `_lo` up to the
    first `_hi` (in time order); that pair changes only at a record's time c (`_hi`
    grows) and at c + lookback + 1 (`_lo` grows). A probe at each of those times, among
    the context records, has the pair of every primary from it to the next probe, and
    the frame [p - lookback, p] holds exactly that run, so a sliding std at the probes
    gives every run's std: a sliding frame is re-aggregated at every row, so it runs
    over 3 rows per context record, never over the primaries (thousands per record).

    Derived from the primaries' window output (as before), it grouped the primaries by
    run and computed their window a second time for that; from the context alone it
    reads no primary. In wall time the two were within a benchmark run's spread; the
    gain is the work the primaries no longer cause.
    """
    lb = lookback_ms
    records = ctx.select("k", "ts_ms", "cnum", F.lit(False).alias("_probe"))
    probes = records.select("k", F.explode(F.array(F.col("ts_ms"), F.col("ts_ms") + F.lit(lb + 1))).alias("ts_ms"),
                            F.lit(None).cast("double").alias("cnum"), F.lit(True).alias("_probe"))
    by_time = Window.partitionBy("k").orderBy("ts_ms")
    at = records.unionByName(probes).select(
        "k", "ts_ms", "_probe",
        F.count("cnum").over(by_time.rangeBetween(Window.unboundedPreceding, -(lb + 1))).alias("_lo"),
        F.count("cnum").over(by_time.rangeBetween(Window.unboundedPreceding, 0)).alias("_hi"),
        F.stddev_pop("cnum").over(by_time.rangeBetween(-lb, 0)).alias("ctx_std"),
    ).filter(F.col("_probe"))
    # Probes at the same time, or whose run did not change, repeat a pair (the pair
    # grows with time, so repeats are neighbours): one row per run, so the join adds no
    # rows. Same partitioning and order as above: no shuffle, no sort.
    prev = F.lag(F.struct("_lo", "_hi")).over(by_time)
    first = prev.isNull() | (prev["_lo"] != F.col("_lo")) | (prev["_hi"] != F.col("_hi"))
    return at.select("k", "_lo", "_hi", "ctx_std", first.alias("_first")).filter("_first").drop("_first")


def _metric(rule: CorrelationRule) -> Column:
    ev, ctx = F.col("ev"), F.col("ctx_num")
    if rule.metric == "ratio_deviation":
        return F.when(ctx != 0, F.abs(ev / ctx - F.lit(1.0)))
    if rule.metric == "difference":
        return ev - ctx
    if rule.metric == "z_score":
        return F.when(F.col("ctx_std") != 0, (ev - ctx) / F.col("ctx_std"))
    return ctx


def _matches(rule: CorrelationRule) -> Column:
    op, value = rule.condition.operator, rule.condition.value
    if rule.metric == "direct" and rule.context_resolution == "last":
        # The context value itself may be a string (`country == "RU"`): compare JSON values.
        return compare(F.try_parse_json(F.col("ctx_json")), op, value)
    metric = F.col("metric_value")
    return F.coalesce(metric.isNotNull() & getattr(metric, _ORDER[op])(F.lit(float(value))), F.lit(False))


def correlation_members(ctx_json: Column, metric: Column, metric_value: Column, ctx_record: Column, with_context: Column) -> Column:
    """The correlation members of a detection; shared with the live job."""
    return extra(
        json_member("context_value", ctx_json),
        json_member("metric", json_string(metric)),
        json_member("metric_value", json_number(metric_value)),
        F.when(with_context, json_member("context", ctx_record)),
    )


def correlation_rule(
    events: DataFrame, rule: CorrelationRule, fields: Fields, primaries_from: tuple[DataFrame, Fields] | None = None
) -> CorrelationOutput:
    """Evaluate one correlation rule; `primaries_from` (events and their Fields) replaces
    the source topic's events when the rule takes its primaries from a velocity rule
    (velocity_filter_rule_id)."""
    if primaries_from is None:
        primaries_from = (events.filter(F.col("topic") == rule.source_topic), fields)
    source, source_fields = primaries_from
    prim, dead = _primaries(source, rule, source_fields)
    ctx = _context(events, rule, fields)
    null_s, null_d = F.lit(None).cast("string"), F.lit(None).cast("double")
    union = prim.select(
        "k", "ts_ms", "seq", F.lit(False).alias("is_ctx"), "topic", "raw", "ev",
        null_d.alias("cnum"), null_s.alias("cjson"), null_s.alias("craw"),
    ).unionByName(
        ctx.select(
            "k", "ts_ms", "seq", F.lit(True).alias("is_ctx"), null_s.alias("topic"), null_s.alias("raw"),
            null_d.alias("ev"), "cnum", "cjson", "craw",
        )
    )
    resolved = _resolve(union, ctx, rule).filter(~F.col("is_ctx") & F.col("has_ctx"))
    judged = resolved.withColumn("metric_value", _metric(rule)).filter(_matches(rule))
    members = correlation_members(
        F.col("ctx_json"), F.lit(rule.metric), F.col("metric_value"), F.col("ctx_record"),
        F.lit(rule.emit_mode in ("context", "both")),
    )
    emits = select_emits(judged, rule, F.col("ts_ms"), members)
    return CorrelationOutput(emits, dead, prim)
