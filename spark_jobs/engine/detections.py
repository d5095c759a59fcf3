"""Emits -> detection records (the sink contract: docs/rule-language.md, "The detection record").

A detection is the original event's JSON with the rule's members appended, so every
field of the event survives byte for byte (nested objects, number formatting) without
a schema. The detection_id hashes what identifies the decision: rule, rule version,
topic and the event text. Replays and restarts of the same input give the same ids,
so downstream consumers can de-duplicate.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.engine.emits import rule_head
from spark_jobs.spark import jvm_column

DETECTION_COLUMNS = ["detection_id", "rule_id", "rule_version", "rule_type", "topic", "seq", "ts_ms", "value"]
_SEP = "\u001f"
CLOCK_CLASS = "ruleplatform.rules.Clock"


def detection_id(rule_id: Column, version: Column, topic: Column, raw: Column) -> Column:
    return F.substring(F.sha2(F.concat_ws(_SEP, rule_id, version, topic, raw), 256), 1, 32)


ISO_MILLIS = "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"


def processed_now() -> Column:
    """ISO-8601 UTC time of the decision: the backtest's run time."""
    return F.date_format(F.current_timestamp(), ISO_MILLIS)


def processed_clock(spark: SparkSession) -> Column:
    """ISO-8601 UTC time of the decision, read from the JVM's clock as the row is
    rendered: what a streaming query's detections carry (ruleplatform.rules.Clock).

    Not `current_timestamp()`: in a streaming query that is the micro-batch's time, put
    into the generated code as a literal, so the output stage's code (the widest of the
    live job) differed at every micro-batch: Spark compiled it again each time (Janino,
    35-65 ms), and the new class ran interpreted until the JIT had seen it again. Not
    `reflect` either, which has no generated code: the projection holding it fell out of
    whole-stage code generation, and every task generated its source again
    (tests/integration/test_live_codegen.py).
    """
    return jvm_column(spark, CLOCK_CLASS, "processed", what="the live clock")


def head_of(emits: DataFrame) -> Column:
    """The rule members of `emits`: its `head` column when the producer rendered it
    (rules known at planning time, see emits.rule_table), else built per row."""
    if "head" in emits.columns:
        return F.col("head")
    return rule_head(F.col("rule_id"), F.col("rule_version"), F.col("rule_type"), F.col("rule_name"))


def detection_value(raw: Column, head: Column, extra: Column, did: Column, processed: Column | None = None) -> Column:
    """The detection JSON text: the event text `raw` with the rule's members appended.

    A Column, not a DataFrame step, so a caller may render detections inside a wider
    projection (the live job picks per row between a detection, a routed event and a
    dead letter in one projection)."""
    processed = processed if processed is not None else processed_now()
    members = F.concat_ws(
        ",",
        head,
        # ISO text of digits, `-`, `:`, `T`, `.` and `Z`: nothing to escape, so quoted as
        # it is (read once per row: the live job's clock is read per row).
        F.concat(F.lit('"processed":"'), processed, F.lit('"')),
        F.concat(F.lit('"detection_id":"'), did, F.lit('"')),
        F.when(extra != F.lit(""), extra),
    )
    # An event is a JSON object: its text ends with `}` and JSON whitespace. The
    # members go in before that brace (the last `}`); a comma first unless the object
    # is empty (a member has a `:`, an empty object none). Cut by bytes, as binary: a
    # string's trim with a set of characters and its substring count characters from
    # the start, with two int arrays the size of the text per trim (a tenth of the live
    # job's CPU went there).
    after = F.substring_index(raw, "}", -1)
    body = F.substring(raw.cast("binary"), F.lit(1), F.octet_length(raw) - F.octet_length(after) - F.lit(1))
    empty_object = ~raw.contains(":")
    return F.concat(body.cast("string"), F.when(empty_object, F.lit("")).otherwise(F.lit(",")), members, F.lit("}"))


def render(emits: DataFrame, processed: Column | None = None, keep: tuple[str, ...] = ()) -> DataFrame:
    """EMIT_COLUMNS (plus `head`, see head_of) -> DETECTION_COLUMNS, `value` being the
    detection JSON text; and the columns `keep` of `emits` as they are."""
    did = detection_id(F.col("rule_id"), F.col("rule_version"), F.col("topic"), F.col("raw"))
    value = detection_value(F.col("raw"), head_of(emits), F.col("extra"), F.col("_did"), processed)
    return emits.withColumn("_did", did).select(
        F.col("_did").alias("detection_id"),
        "rule_id", "rule_version", "rule_type", "topic", "seq", "ts_ms",
        value.alias("value"), *keep,
    )
