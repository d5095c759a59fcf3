"""The history suite run by Great Expectations' Spark datasource on the event archive.

The same suite as `runner.run_quality` (derived from the rules, `suite.suite_specs`),
validated by GX on a Spark DataFrame of the archive's window: nothing is collected to
the driver or re-read as files, and each value is read from the archived VARIANT with
the engine's own conversions (`spark_jobs.engine.values`), so "a key is set", "a
timestamp parses" and "a value is a number" mean what they mean to the rules.

The window is read and its VARIANTs parsed once: every topic's columns go into one
checkpointed frame, one aggregate counts records, malformed records and the required fields
of every topic, and GX's metric queries then run on that checkpoint, not on the table. GX
is asked for counts first (one aggregate query per row condition); only a topic whose
suite fails is validated again with samples of its unexpected values (a query per
expectation), so a clean history costs a handful of Spark jobs, not one per check.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.engine.values import as_number, as_string, field, json_text, timestamp_ms
from spark_jobs.quality.runner import (
    COUNTS_ONLY,
    DATA_DOCS_SITE,
    WITH_SAMPLES,
    _context,
    _forget_results,
    _run,
    _validation,
    offline_data_docs,
)
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


def topic_columns(fields: TopicFields) -> dict[str, Column]:
    """The columns the suite of one topic reads, as expressions over the events' `v`."""
    cols: dict[str, Column] = {}
    for use in fields.uses:
        x = field(F.col("v"), use.field)
        cols[SparkDialect.column(use.field)] = json_text(x)
        if use.kind == "time":
            cols[parsed_time_column(use.field)] = timestamp_ms(x)
        elif use.kind == "numeric":
            cols[SparkDialect.number_column(use.field)] = as_number(x)
    cols.update(_condition_columns(fields))
    return cols


def _quoted(name: str) -> Column:
    return F.col(f"`{name}`")


def history_frame(events: DataFrame, fields: TopicFields) -> DataFrame:
    """Events (with `v`) -> one column per field the suite reads. A required field that
    no record carries is left out, as the pandas frame leaves it out, so the
    required-fields expectation sees the real column set."""
    cols = topic_columns(fields)
    frame = events.select(*[c.alias(n) for n, c in cols.items()]) if cols else events.select(F.lit(1).alias("_"))
    required = [SparkDialect.column(f) for f in fields.required]
    if required:
        seen = frame.agg(*[F.count(_quoted(c)).alias(c) for c in required]).first()
        frame = frame.drop(*[c for c in required if not seen[c]])
    return frame


# Columns of the shared frame besides the suites' own (names no field column can have:
# those are field paths, with `/` for `.`, and a suffix in parentheses).
_TOPIC, _BAD = "#topic", "#malformed"


def _shared_frame(frames: Mapping[str, DataFrame], columns: Mapping[str, Mapping[str, Column]]) -> DataFrame:
    """Every topic's records with its suite's columns (null where another topic's
    suite reads a column), its name and whether it is malformed, in one frame."""
    parts = [
        df.select(F.lit(t).alias(_TOPIC), F.col("_reason").isNotNull().alias(_BAD),
                  *[c.alias(n) for n, c in columns[t].items()])
        for t, df in sorted(frames.items())
    ]
    shared = parts[0]
    for part in parts[1:]:
        shared = shared.unionByName(part, allowMissingColumns=True)
    return shared


def _counts(shared: DataFrame, required: Mapping[str, list[str]]) -> dict[str, dict]:
    """One aggregate over the shared frame: per topic, its records, the malformed ones
    and, of its well-formed ones, how many carry each required column."""
    names = sorted({c for cs in required.values() for c in cs})
    ok = ~_quoted(_BAD)
    rows = shared.groupBy(_quoted(_TOPIC)).agg(
        F.count(F.lit(1)).alias("n"),
        F.count(F.when(_quoted(_BAD), F.lit(1))).alias("bad"),
        *[F.count(F.when(ok, _quoted(c))).alias(f"seen:{c}") for c in names],
    ).collect()
    out = {t: {"n": 0, "bad": 0, "seen": dict.fromkeys(cs, 0)} for t, cs in required.items()}
    for r in rows:
        t = r[_TOPIC]
        if t in out:
            out[t] = {"n": int(r["n"]), "bad": int(r["bad"]), "seen": {c: int(r[f"seen:{c}"]) for c in required[t]}}
    return out


def run_quality_spark(
    frames: Mapping[str, DataFrame],
    rules: Iterable[AnyRule],
    *,
    time_field: str = "timestamp",
    window_ms: Mapping[str, tuple[int, int]] | tuple[int, int] | None = None,
    data_docs_dir: Path | str | None = None,
    source: str = "",
    collect_max_rows: int = 0,
) -> dict:
    """Validate each topic's records (DataFrames of the engine's input with `v` and
    `_reason`, e.g. `archive.table.engine_input` + `events.with_reasons`); the result has
    the shape `run_quality` returns, with `engine` "great_expectations (spark)".

    A window of at most `collect_max_rows` well-formed records is validated by GX's
    pandas engine on the columns Spark derived, collected to this process (`engine`
    "great_expectations (pandas, values read by spark)"): the same suite, the same
    values, and no Spark query per expectation, which on a small window cost far more
    than the checks."""
    rules = list(rules)
    per_topic = topic_fields(rules, time_field)
    docs = Path(data_docs_dir) if data_docs_dir is not None else None
    ctx = _context(docs)
    # The shared frame is checkpointed already: GX persisting each batch again would
    # only copy it.
    fields_of = {t: per_topic.get(t) or TopicFields() for t in frames}
    columns = {t: topic_columns(f) for t, f in fields_of.items()}
    required = {t: [SparkDialect.column(c) for c in f.required] for t, f in fields_of.items()}
    # Checkpointed, not only cached: every query GX makes is then planned over a scan of
    # the checkpoint, not over the window's read and its VARIANT expressions again (on
    # Spark Connect each query is analysed and optimised on the server; with the full
    # lineage that cost more than running it).
    shared = _shared_frame(frames, columns).localCheckpoint(eager=True) if frames else None
    topics: dict[str, dict] = {}
    failed = 0
    try:
        counts = _counts(shared, required) if shared is not None else {}
        on_driver = collect_max_rows > 0 and sum(c["n"] - c["bad"] for c in counts.values()) <= collect_max_rows
        parser = "pandas" if on_driver else "spark"
        datasource = ctx.data_sources.add_pandas("history") if on_driver else ctx.data_sources.add_spark(
            "history", persist=False)
        for topic in sorted(frames):
            c = counts[topic]
            events = shared.filter((_quoted(_TOPIC) == topic) & ~_quoted(_BAD))
            missing = {n for n, k in c["seen"].items() if not k}
            keep = [n for n in columns[topic] if n not in missing]
            frame = events.select(*[_quoted(n) for n in keep]) if columns[topic] else events.select(F.lit(1).alias("_"))
            win = window_ms.get(topic) if isinstance(window_ms, Mapping) else window_ms
            if on_driver:
                frame = frame.toPandas()
            vd = _validation(ctx, datasource, topic, suite_specs(fields_of[topic], win, spark=True, parser=parser))
            ok, exps = _run(vd, frame, COUNTS_ONLY)
            if not ok:
                # Only a failing suite shows samples: validated again with them, and only
                # that run kept for the Data Docs.
                _forget_results(ctx, vd.suite.name)
                ok, exps = _run(vd, frame, WITH_SAMPLES)
            failed += sum(1 for e in exps if not e["success"])
            topics[topic] = {
                "path": f"{source}#topic={topic}" if source else topic,
                "records": c["n"] - c["bad"],
                "malformed": c["bad"],
                "success": ok,
                "expectations": exps,
            }
    finally:
        if shared is not None:
            shared.unpersist()
            del shared  # a Connect client releases the server's checkpoint with the object
    if docs is not None:
        ctx.build_data_docs(site_names=[DATA_DOCS_SITE])
        offline_data_docs(docs)
    return {
        "success": all(t["success"] for t in topics.values()),
        "failed_expectations": failed,
        "malformed": sum(t["malformed"] for t in topics.values()),
        "topics": topics,
        "data_docs_dir": str(docs) if docs is not None else None,
        "engine": "great_expectations (pandas, values read by spark)" if on_driver else "great_expectations (spark)",
    }
