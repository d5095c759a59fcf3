"""Correlation rules in batch: primaries judged against context for the same key, by
the live job's own resolution and judgement in the JVM (`BatchCorrelation`, over
Correlation.resolve/judge in spark_jobs/jvm/processor).

Here, in Spark SQL, each rule's primaries and context records are read (field reads,
the context type filter) and unioned with every other rule's; the pass sorts them per
(rule, key) by (time, context first, arrival) and judges each primary against the
context in [t - lookback, t].
Because the backtest sees all context regardless of arrival order, a primary that
arrived before its context is judged against it, which is what the live job reaches
by holding such primaries until the watermark passes them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.engine.conditions import compare
from spark_jobs.engine.emits import extra, json_member, json_number, json_string, rule_emits, rule_table
from spark_jobs.engine.events import dead_letters
from spark_jobs.engine.frames import union_all
from spark_jobs.engine.jvm_pass import run_pass
from spark_jobs.engine.rule_set import rule_spec
from spark_jobs.engine.values import Fields
from spark_jobs.rules.model import CorrelationRule


@dataclass
class CorrelationOutput:
    emits: DataFrame  # EMIT_COLUMNS
    dead: DataFrame
    primaries: dict[str, DataFrame]  # rule id -> its primaries, counted for the summary ("events evaluated")


def _primaries(source: DataFrame, rule: CorrelationRule, fields: Fields) -> tuple[DataFrame, DataFrame]:
    ev_val = fields.value(rule.event_value_field).num if rule.event_value_field else F.lit(None).cast("double")
    p = source.select(
        "topic", "seq", "raw",
        fields.key(rule.correlation_key).alias("k"),
        fields.time(rule.timestamp_field).alias("ts_ms"),
        ev_val.alias("ev"),
    ).filter(F.col("k").isNotNull())
    dead = dead_letters(p.filter(F.col("ts_ms").isNull()), F.lit(_no_time(rule)), rule.rule_id)
    return p.filter(F.col("ts_ms").isNotNull()), dead


def _context(events: DataFrame, rule: CorrelationRule, fields: Fields) -> tuple[DataFrame, DataFrame]:
    """The rule's context records (key, time and value usable), and the dead letters of
    those that have their key and value but no usable time (they cannot be placed in
    any lookback; the live job dead-letters them too)."""
    c = events.filter(F.col("topic") == rule.context_topic)
    if rule.context_type_field is not None:
        c = c.filter(compare(fields.value(rule.context_type_field), "==", rule.context_type_value))
    cval = fields.value(rule.context_value_field)
    c = c.select(
        "topic", "seq",
        fields.key(rule.correlation_key).alias("k"),
        fields.time(rule.timestamp_field).alias("ts_ms"),
        cval.num.alias("cnum"),
        cval.json.alias("cjson"),
        F.col("raw").alias("craw"),
    ).filter(F.col("k").isNotNull() & F.col("cjson").isNotNull())
    if rule.context_resolution != "last" or rule.metric != "direct":
        c = c.filter(F.col("cnum").isNotNull())
    dead = dead_letters(c.filter(F.col("ts_ms").isNull()).withColumnRenamed("craw", "raw"),
                        F.lit(_no_time(rule)), rule.rule_id)
    return c.filter(F.col("ts_ms").isNotNull()).drop("topic"), dead


def _no_time(rule: CorrelationRule) -> str:
    return f"missing or unparseable timestamp field '{rule.timestamp_field}' needed by correlation rule"


def correlation_members(ctx_json: Column, metric: Column, metric_value: Column, ctx_record: Column, with_context: Column) -> Column:
    """The correlation members of a detection; shared with the live job."""
    return extra(
        json_member("context_value", ctx_json),
        json_member("metric", json_string(metric)),
        json_member("metric_value", json_number(metric_value)),
        F.when(with_context, json_member("context", ctx_record)),
    )


def correlation_rules(
    events: DataFrame, rules: list[CorrelationRule], fields: Fields,
    primaries_from: dict[str, tuple[DataFrame, Fields]] | None = None,
) -> CorrelationOutput:
    """Evaluate the correlation rules in one pass (one shuffle and sort for all of them);
    `primaries_from` (rule id -> events and their Fields) replaces a rule's source topic
    events when it takes its primaries from a velocity rule (velocity_filter_rule_id)."""
    primaries_from = primaries_from or {}
    null_s, null_d = F.lit(None).cast("string"), F.lit(None).cast("double")
    rows: list[DataFrame] = []
    dead: list[DataFrame] = []
    primaries: dict[str, DataFrame] = {}
    for i, rule in enumerate(rules):
        source, source_fields = primaries_from.get(rule.rule_id) or (
            events.filter(F.col("topic") == rule.source_topic), fields)
        prim, prim_dead = _primaries(source, rule, source_fields)
        ctx, ctx_dead = _context(events, rule, fields)
        dead += [prim_dead, ctx_dead]
        primaries[rule.rule_id] = prim
        r = F.lit(i).alias("r")
        rows += [
            prim.select(r, "k", "ts_ms", "seq", F.lit(False).alias("is_ctx"), "topic", "raw", "ev",
                        null_d.alias("cnum"), null_s.alias("cjson"), null_s.alias("craw")),
            ctx.select(r, "k", "ts_ms", "seq", F.lit(True).alias("is_ctx"), null_s.alias("topic"),
                       null_s.alias("raw"), null_d.alias("ev"), "cnum", "cjson", "craw"),
        ]
    spec = {"rules": [rule_spec(rule, signature="") for rule in rules]}
    judged = run_pass(union_all(rows), "correlation", json.dumps(spec, allow_nan=False))
    meta = F.element_at(rule_table(rules, metric=[r.metric for r in rules],
                                   emit_context=[str(r.emit_mode in ("context", "both")).lower() for r in rules]),
                        F.col("_i") + 1)
    # Under mean and mean_std the context value is the mean (the pass gives it as a number).
    ctx_json = F.coalesce(F.col("ctx_json"), json_number(F.col("ctx_num")))
    members = correlation_members(ctx_json, meta["metric"], F.col("metric_value"), F.col("ctx_record"),
                                  meta["emit_context"] == F.lit("true"))
    return CorrelationOutput(rule_emits(judged, meta, F.col("ts_ms"), members), union_all(dead), primaries)
