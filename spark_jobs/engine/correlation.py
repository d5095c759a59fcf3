"""Correlation rules in batch: primaries judged against context for the same key, by
the live job's own resolution and judgement in the JVM (`BatchCorrelation`, over
Correlation.resolve/judge in spark_jobs/jvm/processor).

The primaries and context records are the rows the live evaluator says an event enters
(keyed.entered: a primary or context row of a rule, with its key, time and value); the
pass sorts every rule's rows per (rule, key) by (time, context first, arrival) and
judges each primary against the context in [t - lookback, t]: one shuffle and one sort
for the whole rule set.
Because the backtest sees all context regardless of arrival order, a primary that
arrived before its context is judged against it, which is what the live job reaches
by holding such primaries until the watermark passes them.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.engine.emits import extra, json_member, json_number, json_string, rule_emits
from spark_jobs.engine.jvm_pass import run_pass
from spark_jobs.engine.keyed import KeyedRows, untimed
from spark_jobs.engine.rule_set import rule_spec


@dataclass
class CorrelationOutput:
    emits: DataFrame | None  # EMIT_COLUMNS
    dead: DataFrame | None
    primaries: DataFrame | None  # rule_id per primary, counted for the summary ("events evaluated")


def correlation_members(ctx_json: Column, metric: Column, metric_value: Column, ctx_record: Column, with_context: Column) -> Column:
    """The correlation members of a detection; shared with the live job."""
    return extra(
        json_member("context_value", ctx_json),
        json_member("metric", json_string(metric)),
        json_member("metric_value", json_number(metric_value)),
        F.when(with_context, json_member("context", ctx_record)),
    )


def correlation_rules(entered: DataFrame, keyed: KeyedRows, meta: Column) -> CorrelationOutput:
    """The correlation rules over `entered` (keyed.entered of both stages, routed events
    included), `meta` the entry of `keyed.table()` of a row's `_i`."""
    primary_rows = keyed.indexes("primary")
    if not primary_rows:
        return CorrelationOutput(None, None, None)
    mine = entered.filter(F.col("_i").isin([*primary_rows, *keyed.indexes("context")])).select("*", meta.alias("_meta"))
    timed = mine.filter(F.col("ts_ms").isNotNull())
    is_ctx = F.col("_meta.kind") == F.lit("context")
    rows = timed.select(
        F.col("_meta.owner").cast("int").alias("r"), "k", "ts_ms", "seq", is_ctx.alias("is_ctx"),
        F.when(~is_ctx, F.col("topic")).alias("topic"), F.when(~is_ctx, F.col("raw")).alias("raw"),
        F.when(~is_ctx, F.col("num")).alias("ev"),
        F.when(is_ctx, F.col("num")).alias("cnum"), F.when(is_ctx, F.col("jv")).alias("cjson"),
        F.when(is_ctx, F.col("raw")).alias("craw"),
    )
    spec = {i: rule_spec(keyed.rules[i], signature="") for i in primary_rows}
    judged = run_pass(rows, "correlation", keyed.operator_spec("primary", spec))  # `_i`: the primary row
    # Under mean and mean_std the context value is the mean (the pass gives it as a number).
    ctx_json = F.coalesce(F.col("ctx_json"), json_number(F.col("ctx_num")))
    members = correlation_members(ctx_json, meta["metric"], F.col("metric_value"), F.col("ctx_record"),
                                  meta["emit_context"] == F.lit("true"))
    primaries = timed.filter(~is_ctx).select(F.col("_meta.rule_id").alias("rule_id"))
    return CorrelationOutput(rule_emits(judged, meta, F.col("ts_ms"), members), untimed(mine, F.col("_meta")), primaries)
