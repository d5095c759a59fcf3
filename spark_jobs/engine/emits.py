"""The common shape of what a rule emits, before it becomes a detection record.

Every rule type produces rows of EMIT_COLUMNS: which rule, which event (topic, seq,
raw text), the event's time, and `extra`, the rule-type specific members of the
detection (a JSON object body without braces). Keeping one shape lets threshold,
velocity and correlation outputs be unioned and rendered by one function.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.rules.model import AnyRule

EMIT_COLUMNS = ["rule_id", "rule_version", "rule_type", "rule_name", "topic", "seq", "ts_ms", "raw", "extra"]


def rule_meta(rule: AnyRule) -> list[Column]:
    return [
        F.lit(rule.rule_id).alias("rule_id"),
        F.lit(rule.version).alias("rule_version"),
        F.lit(rule.rule_type).alias("rule_type"),
        F.lit(rule.name).cast("string").alias("rule_name"),
    ]


def json_member(name: str, json_value: Column) -> Column:
    """`"name":<json>`; a NULL value renders as JSON null."""
    return F.concat(F.lit(f'"{name}":'), F.coalesce(json_value, F.lit("null")))


def json_string(col: Column) -> Column:
    """A string column as JSON text (quoted and escaped)."""
    return F.regexp_replace(F.to_json(F.array(col)), r"^\[(.*)\]$", "$1")


def json_number(col: Column) -> Column:
    return col.cast("string")


def extra(*members: Column) -> Column:
    return F.concat_ws(",", *members)


def select_emits(df: DataFrame, rule: AnyRule, ts_ms: Column, extra_json: Column) -> DataFrame:
    return df.select(*rule_meta(rule), "topic", "seq", ts_ms.alias("ts_ms"), "raw", extra_json.alias("extra"))
