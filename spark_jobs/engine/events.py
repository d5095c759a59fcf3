"""Raw records -> parsed events, and the dead letters that parsing produces.

Input to the engine is a DataFrame of raw records with the columns of RAW_COLUMNS
(whatever the source: a JSON Lines file, Parquet, or a Kafka topic). Records that are
not a JSON object never reach a rule; they become dead letters with a reason.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

# topic: the topic the record belongs to; seq: arrival order (unique, increasing);
# raw: the record text; proc_ms: the record's processing time in epoch ms (the broker
# timestamp on a topic replay, the --time-field for file inputs), NULL when unknown.
RAW_COLUMNS = ["topic", "seq", "raw", "proc_ms"]
DEAD_LETTER_COLUMNS = ["topic", "seq", "raw", "reason", "rule_id"]


def parse_variant(raw: Column) -> Column:
    """The record text as VARIANT, NULL when it is not JSON or not valid UTF-8.

    Text that is not valid UTF-8 (bytes cast to a string are not checked) is never
    parsed: its values could not cross into Python (Arrow rejects them) or be written
    back as the JSON text of a detection. The event archive stores this column, so a
    backtest over the archive reads the parse the live job would have made."""
    return F.when(F.is_valid_utf8(raw), F.try_parse_json(raw))


def classify(raw: DataFrame) -> DataFrame:
    """Raw records with `v` (VARIANT) and `_reason` (why it is not an event, or NULL)."""
    return with_reasons(raw.withColumn("v", parse_variant(F.col("raw"))))


def with_reasons(parsed: DataFrame) -> DataFrame:
    """Records that already carry `v` (parse_variant of `raw`, e.g. read from the event
    archive) with `_reason`, without parsing them again."""
    utf8 = F.is_valid_utf8(F.col("raw"))
    is_object = F.ltrim(F.col("raw")).startswith("{")
    return parsed.withColumn(
        "_reason",
        F.when(F.col("raw").isNull(), F.lit("empty record"))
        .when(~utf8, F.lit("not valid UTF-8"))
        .when(F.col("v").isNull(), F.lit("not valid JSON"))
        .when(~is_object, F.lit("not a JSON object")),
    )


def split(parsed: DataFrame) -> tuple[DataFrame, DataFrame]:
    """A classified DataFrame -> (events, dead letters)."""
    events = parsed.filter(F.col("_reason").isNull()).drop("_reason")
    dead = parsed.filter(F.col("_reason").isNotNull()).select(
        "topic", "seq", "raw", F.col("_reason").alias("reason"), F.lit(None).cast("string").alias("rule_id")
    )
    return events, dead


def parse_events(raw: DataFrame) -> tuple[DataFrame, DataFrame]:
    """Split raw records into (events with a VARIANT column `v`, dead letters)."""
    return split(classify(raw))


def dead_letters(df: DataFrame, reason: Column, rule_id: str) -> DataFrame:
    """Dead letters for one rule (e.g. a missing event-time timestamp)."""
    return df.select("topic", "seq", "raw", reason.alias("reason"), F.lit(rule_id).alias("rule_id"))
