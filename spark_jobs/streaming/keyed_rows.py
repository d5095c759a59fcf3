"""The rows the live job's keyed operators (jvm_operator.py) write.

The job hands each keyed operator one row per (event, key group) (keyed_input.py); the
operators write OUTPUT_SCHEMA rows (CHAINED_SCHEMA when a second operator follows).
"""

from __future__ import annotations

from pyspark.sql.types import (
    BooleanType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

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
