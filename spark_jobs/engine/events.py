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


def classify(raw: DataFrame) -> DataFrame:
    """Raw records with `v` (VARIANT) and `_reason` (why it is not an event, or NULL)."""
    # Text that is not valid UTF-8 (bytes cast to a string are not checked) is never
    # parsed: its values could not cross into Python (Arrow rejects them) or be written
    # back as the JSON text of a detection.
    utf8 = F.is_valid_utf8(F.col("raw"))
    v = F.when(utf8, F.try_parse_json(F.col("raw")))
    is_object = F.ltrim(F.col("raw")).startswith("{")
    return raw.withColumn("v", v).withColumn(
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
