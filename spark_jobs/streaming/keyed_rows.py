"""The rows of the live job's keyed operators (jvm_operator.py) and the rules they name.

The job hands each keyed operator one row per (event, key group) (compiled.key_rows),
the indexes of the rule rows the event enters in `m`, each index naming a `Slot`; the
operators write OUTPUT_SCHEMA rows (CHAINED_SCHEMA when a second operator follows).
The rules reach the operator by reference: a slot names its rule's definition in the
job's defs_dir (rules_source.RULE_DEFS), read once per process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs.rules.model import AnyRule, parse_rule
from spark_jobs.streaming.rules_source import rule_def_path

OUTPUT_SCHEMA = StructType([
    StructField("kind", StringType()),  # detection | routed | dead
    StructField("rule_id", StringType()),
    StructField("rule_version", StringType()),
    StructField("rule_type", StringType()),
    StructField("rule_name", StringType()),
    StructField("topic", StringType()),
    StructField("seq", LongType()),
    StructField("ts_ms", LongType()),
    StructField("raw", StringType()),
    StructField("agg_type", StringType()),
    StructField("agg_value", DoubleType()),
    StructField("metric", StringType()),
    StructField("emit_context", BooleanType()),
    StructField("ctx_num", DoubleType()),
    StructField("ctx_json", StringType()),
    StructField("metric_value", DoubleType()),
    StructField("ctx_record", StringType()),
    StructField("reason", StringType()),
])
OUTPUT_COLUMNS = [f.name for f in OUTPUT_SCHEMA.fields]

# Velocity emits bound for correlation rules (`emit_to_sink: false`) never leave the job
# (docs/rule-language.md, "Routing"): a second operator, chained behind the first in every plan (job.py
# `build`), judges them in the same micro-batch. Spark chains a stateful operator behind
# another only when the first stamps each output row with an event time
# (eventTimeColumnName) that is not behind its watermark: `et`, the row's own time or the
# watermark + 1 ms, whichever is later (only for Spark; the row's time stays in ts_ms).
CHAINED_SCHEMA = StructType([*OUTPUT_SCHEMA.fields, StructField("et", TimestampType())])
# The operators' groups of rows that only pass through them: each event's threshold
# matches, dead letters and (for the second operator's correlation rules) context
# records, then the first operator's own detections and dead letters. The plan is one
# line from its one scan of the input to the sink, because Spark plans a DataFrame
# that feeds two branches of a streaming query once per branch: a second scan and
# parse of the input, or a stateful operator twice, each copy with a state of its own.
# No rule's key group is this (key groups are JSON paths).
PASS_GID = "\u0000pass"


class Slot(NamedTuple):
    """One keyed rule row of the plan, named by its index in an input row's `m`: the
    rule (by `rule_ref` in the job's defs_dir), its role, and the columns its time and
    value are in."""

    rule_ref: str
    role: str  # source | context | routed
    event_time: bool
    ts_col: str  # epoch ms (proc_ms: processing time)
    far_col: str | None  # why the time is unusable (NULL: it is usable)
    num_col: str | None
    jv_col: str | None


_BY_REF: dict[tuple[str, str], tuple[AnyRule, str]] = {}


def slot_rule(slot: Slot, defs_dir: str | Path) -> tuple[AnyRule, str]:
    """The rule a slot names, read from `defs_dir` by its reference once per process, and
    its state signature."""
    key = (str(defs_dir), slot.rule_ref)
    hit = _BY_REF.get(key)
    if hit is None:
        if len(_BY_REF) > 10_000:
            _BY_REF.clear()
        rule = parse_rule(json.loads(rule_def_path(defs_dir, slot.rule_ref).read_text()))
        hit = _BY_REF[key] = (rule, signature(rule))
    return hit


def signature(rule: AnyRule) -> str:
    """What a window or context buffer depends on; a version that changes it resets state.

    A new threshold or emit mode keeps the window (it applies from the next event);
    new conditions, grouping or value fields mean old entries no longer qualify.
    """
    d = rule.model_dump(mode="json")
    keep = ("source_topic", "conditions", "group_by", "aggregation_field", "aggregation_type", "time_mode",
            "timestamp_field", "context_topic", "correlation_key", "context_value_field", "context_type_field",
            "context_type_value", "event_value_field")
    return json.dumps({k: d.get(k) for k in keep}, sort_keys=True)
