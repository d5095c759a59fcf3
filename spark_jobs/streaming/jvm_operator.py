"""The live job's keyed operator, in the JVM: velocity and correlation rules by key.

`ruleplatform.keyed.DetectionProcessor` (spark_jobs/jvm/processor) is a Java
StatefulProcessor for transformWithState: it takes the key rows of compiled.key_rows
plus `bucket`, grouped by (gid, bucket), and writes OUTPUT_SCHEMA rows
(keyed_rows.py). Rows and state stay in the JVM: no row crosses to a Python worker and
no state call is a round trip.

The rules reach it once, when the plan is built: `operator_spec` reads each slot's rule
by reference in the job's defs_dir and hands the JVM the values the rule model derives
(window and lookback in ms, the watermark delay in ms, the state signature, the
condition's typed value), so the JVM re-derives nothing the model defines. Its state
is a MapState entry per key and rule, plus the bucket's timer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Literal

from pyspark.sql import DataFrame, SparkSession

from spark_jobs.engine.conditions import value_spec
from spark_jobs.rules.model import AnyRule, CorrelationRule, VelocityRule
from spark_jobs.streaming.keyed_rows import CHAINED_SCHEMA, OUTPUT_SCHEMA, Slot, slot_rule

OPERATOR_CLASS = "ruleplatform.keyed.KeyedOperator"


def rule_spec(rule: AnyRule, signature: str) -> dict:
    """What the JVM operator reads of one keyed rule (RuleSpec.java)."""
    d: dict = {
        "rule_id": rule.rule_id,
        "version": rule.version,
        "rule_type": rule.rule_type,
        "name": rule.name,
        "signature": signature,
        "uses_event_time": rule.uses_event_time,
        "timestamp_field": rule.timestamp_field,
        "window_ms": rule.window_ms,
    }
    if isinstance(rule, VelocityRule):
        d.update(
            watermark_delay_ms=int(rule.watermark_delay * 1000),
            aggregation_type=rule.aggregation_type,
            threshold=float(rule.threshold),
            emit_mode=rule.emit_mode,
            emit_to_sink=rule.emit_to_sink,
        )
    elif isinstance(rule, CorrelationRule):
        spec = value_spec(rule.condition.value)
        d.update(
            watermark_delay_ms=int(rule.watermark_delay * 1000),
            lookback_ms=rule.lookback_ms,
            context_resolution=rule.context_resolution,
            min_context_points=rule.min_context_points,
            metric=rule.metric,
            emit_context=rule.emit_mode in ("context", "both"),
            cond_op=rule.condition.operator,
            cond_kind=spec["kind"],
            cond_num=spec["num"],
            cond_bool=spec["bool"],
            cond_str=spec["str"],
        )
    else:
        raise ValueError(f"rule {rule.rule_id} is no keyed rule ({rule.rule_type})")
    return d


def operator_spec(slots: Sequence[Slot], defs_dir: str) -> str:
    """The slots and their rules as the JVM operator's constructor argument (JSON)."""
    out = []
    for slot in slots:
        rule, sig = slot_rule(slot, defs_dir)
        out.append({
            "role": slot.role, "event_time": slot.event_time, "ts_col": slot.ts_col, "far_col": slot.far_col,
            "num_col": slot.num_col, "jv_col": slot.jv_col, "rule": rule_spec(rule, sig),
        })
    return json.dumps({"slots": out}, allow_nan=False)


def keyed_operator(stateful_in: DataFrame, slots: Sequence[Slot], defs_dir: str,
                   place: Literal["alone", "first", "second"] = "alone") -> DataFrame:
    """`stateful_in` (key rows with `gid`, `bucket` and the job's watermark) through the
    JVM operator: OUTPUT_SCHEMA rows; the slots' rules are read from `defs_dir`.

    `place` in the live plan's chain (job.py `build`): "first" adds `et` (CHAINED_SCHEMA)
    for the operator behind it; "second" hands the PASS_GID groups' rows on unchanged,
    in the JVM (no round trip of every detection through Python)."""
    spark: SparkSession = stateful_in.sparkSession
    jvm = spark._jvm  # type: ignore[attr-defined]
    assert jvm is not None, "the JVM operator needs a classic (non-Connect) SparkSession"
    operator = jvm
    for part in OPERATOR_CLASS.split("."):
        operator = getattr(operator, part)
    entry = {"alone": operator.apply, "first": operator.first, "second": operator.second}[place]
    out = DataFrame(entry(stateful_in._jdf, operator_spec(slots, defs_dir)), spark)
    schema = CHAINED_SCHEMA if place == "first" else OUTPUT_SCHEMA
    # The two definitions must not drift apart (`et` carries Spark's watermark metadata).
    if [(f.name, f.dataType) for f in out.schema.fields] != [(f.name, f.dataType) for f in schema.fields]:
        raise RuntimeError(f"JVM operator schema {out.schema} is not {schema}")
    return out
