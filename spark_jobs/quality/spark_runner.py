"""The history suite run by Great Expectations' Spark datasource on the event archive.

The same suite as `runner.run_quality` (derived from the rules, `suite.suite_specs`),
validated by GX on a Spark DataFrame of the archive's window: nothing is collected to
the driver or re-read as files, and each value is read from the archived VARIANT with
the engine's own conversions (`spark_jobs.engine.values`), so "a key is set", "a
timestamp parses" and "a value is a number" mean what they mean to the rules.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.engine.values import as_number, as_string, field, json_text, timestamp_ms
from spark_jobs.quality.runner import DATA_DOCS_SITE, _context, _validate, offline_data_docs
from spark_jobs.quality.suite import SparkDialect, TopicFields, parsed_time_column, suite_specs, topic_fields
from spark_jobs.rules.model import AnyRule


def _condition_columns(fields: TopicFields) -> dict[str, Column]:
    out: dict[str, Column] = {}
    for use in fields.uses:
        for f, _op, v in use.condition:
            x = field(F.col("v"), f)
            if isinstance(v, bool):
                out[SparkDialect.condition_column(f, "json")] = json_text(x)
            elif isinstance(v, int | float):
                out[SparkDialect.condition_column(f, "num")] = as_number(x)
            elif v is not None:
                out[SparkDialect.condition_column(f, "str")] = as_string(x)
            out[SparkDialect.column(f)] = json_text(x)
    return out


def history_frame(events: DataFrame, fields: TopicFields) -> DataFrame:
    """Events (with `v`) -> one column per field the suite reads. A required field that
    no record carries is left out, as the pandas frame leaves it out, so the
    required-fields expectation sees the real column set."""
    cols: dict[str, Column] = {}
    for use in fields.uses:
        x = field(F.col("v"), use.field)
        cols[SparkDialect.column(use.field)] = json_text(x)
        if use.kind == "time":
            cols[parsed_time_column(use.field)] = timestamp_ms(x)
        elif use.kind == "numeric":
            cols[SparkDialect.number_column(use.field)] = as_number(x)
    cols.update(_condition_columns(fields))
    frame = events.select(*[c.alias(n) for n, c in cols.items()]) if cols else events.select(F.lit(1).alias("_"))
    required = [SparkDialect.column(f) for f in fields.required]
    if required:
        seen = frame.agg(*[F.count(F.col(f"`{c}`")).alias(c) for c in required]).first()
        frame = frame.drop(*[c for c in required if not seen[c]])
    return frame


def run_quality_spark(
    frames: Mapping[str, DataFrame],
    rules: Iterable[AnyRule],
    *,
    time_field: str = "timestamp",
    window_ms: Mapping[str, tuple[int, int]] | tuple[int, int] | None = None,
    data_docs_dir: Path | str | None = None,
    source: str = "",
) -> dict:
    """Validate each topic's records (DataFrames of the engine's input with `v` and
    `_reason`, e.g. `archive.table.engine_input` + `events.with_reasons`); the result has
    the shape `run_quality` returns, with `engine` "great_expectations (spark)"."""
    rules = list(rules)
    per_topic = topic_fields(rules, time_field)
    docs = Path(data_docs_dir) if data_docs_dir is not None else None
    ctx = _context(docs)
    datasource = ctx.data_sources.add_spark("history")
    topics: dict[str, dict] = {}
    failed = 0
    for topic, df in sorted(frames.items()):
        fields = per_topic.get(topic) or TopicFields()
        counts = df.agg(F.count(F.lit(1)).alias("n"), F.count(F.col("_reason")).alias("bad")).first()
        events = df.filter(F.col("_reason").isNull())
        frame = history_frame(events, fields).cache()
        win = window_ms.get(topic) if isinstance(window_ms, Mapping) else window_ms
        ok, exps = _validate(ctx, datasource, topic, suite_specs(fields, win, spark=True), frame)
        frame.unpersist()
        failed += sum(1 for e in exps if not e["success"])
        topics[topic] = {
            "path": f"{source}#topic={topic}" if source else topic,
            "records": int(counts["n"]) - int(counts["bad"]),
            "malformed": int(counts["bad"]),
            "success": ok,
            "expectations": exps,
        }
    if docs is not None:
        ctx.build_data_docs(site_names=[DATA_DOCS_SITE])
        offline_data_docs(docs)
    return {
        "success": all(t["success"] for t in topics.values()),
        "failed_expectations": failed,
        "malformed": sum(t["malformed"] for t in topics.values()),
        "topics": topics,
        "data_docs_dir": str(docs) if docs is not None else None,
        "engine": "great_expectations (spark)",
    }
