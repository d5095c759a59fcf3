"""Velocity rules in batch: sliding (per-event, not aligned) windows, evaluated by the
live job's own window code in the JVM.

Every velocity rule of the set is evaluated in one pass: the rows the live evaluator
says an event enters (keyed.entered: one per event and rule, with the rule's key, time
and value) are shuffled and sorted once by (rule, key, time, arrival), then
`BatchVelocity` (spark_jobs/jvm/processor) slides a window per key and rule over them
with `Velocity.Window`, the live job's aggregation (exact sums, monotonic deques for
min/max, value counts for distinct_count) and its emit rule: O(1) amortized per entered
row. The event text rides along, so emitted rows need no join back to their events.
The plan is the same for one rule or a thousand, on one topic or fifty.

The window at an event at time t holds the key's qualifying events with timestamps in
(t - W, t] that were taken at or before it; equal timestamps are taken in arrival order
(docs/rule-language.md, "Velocity rules"). A classic session calls the pass through
Py4J, a Spark Connect client through the server's relation plugin (`jvm_pass`).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.engine.emits import extra, json_member, json_number, json_string, rule_emits
from spark_jobs.engine.jvm_pass import run_pass
from spark_jobs.engine.keyed import KeyedRows, untimed
from spark_jobs.rules.model import VelocityRule

ROUTED_COLUMNS = ["rule_id", "topic", "seq", "raw", "proc_ms", "ts_ms"]


@dataclass
class VelocityOutput:
    # EMIT_COLUMNS of the rules that emit to the sink, and `reason`: where set, no
    # detection but a dead letter (pipeline.EngineResult.evaluated)
    emits: DataFrame | None
    routed: DataFrame | None  # ROUTED_COLUMNS: the emits of rules with emit_to_sink false, by rule id
    dead: DataFrame | None


def velocity_rules(entered: DataFrame, keyed: KeyedRows, meta: Column) -> VelocityOutput:
    """The velocity rules over `entered` (keyed.entered of the first stage), `meta` the
    entry of `keyed.table()` of a row's `_i`."""
    rows = keyed.indexes("velocity")
    if not rows:
        return VelocityOutput(None, None, None)
    mine = entered.filter(F.col("_i").isin(rows))
    spec = {}
    for i in rows:
        r = keyed.rules[i]
        assert isinstance(r, VelocityRule)
        spec[i] = {"aggregation_type": r.aggregation_type, "window_ms": r.window_ms, "threshold": float(r.threshold),
                   "all_events": r.emit_mode == "all_events"}
    fired = run_pass(mine.filter(F.col("ts_ms").isNotNull()).drop("issue"), "velocity",
                     keyed.operator_spec("velocity", spec))
    m = fired.select("*", meta.alias("_meta"))
    to_sink = [i for i in rows if keyed.rules[i].emit_to_sink]
    routed = None
    if len(to_sink) < len(rows):
        routed = (m.filter(~F.col("_i").isin(to_sink) & F.col("reason").isNull())
                  .select(F.col("_meta.rule_id").alias("rule_id"), "topic", "seq", "raw", "proc_ms", "ts_ms"))
    # A routed rule's dead letters go to the sink's dead letters all the same.
    emitted = m.filter(F.col("_i").isin(to_sink) | F.col("reason").isNotNull())
    emits = rule_emits(emitted, F.col("_meta"), F.col("ts_ms"),
                       velocity_members(F.col("_meta.agg_type"), F.col("agg")), "reason")
    return VelocityOutput(emits, routed, untimed(mine, meta))


def velocity_members(agg_type: Column, agg: Column) -> Column:
    """The velocity members of a detection; shared with the live job."""
    value = F.when(agg_type.isin("count", "distinct_count"), json_number(agg.cast("long"))).otherwise(json_number(agg))
    return extra(
        json_member("aggregation_type", json_string(agg_type)),
        json_member("aggregation_value", value),
    )
