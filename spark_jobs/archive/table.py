"""The archive table: its schema, where it lives, and how a backtest reads it.

One row per Kafka record of an archived topic, written by `spark_jobs.archive.job`:

    topic      STRING     partition column
    date       DATE       partition column: the UTC date of the broker timestamp
    partition  INT        Kafka partition
    offset     BIGINT     Kafka offset
    timestamp  TIMESTAMP  broker timestamp (CreateTime/LogAppendTime as the topic says)
    key        BINARY     record key, as produced
    value      BINARY     record value, as produced (the raw event)
    v          VARIANT    the event parsed once (`try_parse_json` of valid UTF-8; NULL
                          when the record is not JSON): what every rule reads
    ts_ms      BIGINT     event time in epoch ms from the event's time field, parsed as
                          the engine parses it (`timestamp_ms`); NULL when absent or
                          unparseable
    archived_at TIMESTAMP when the archive job wrote the row

Partitioning by topic and broker date lets a backtest over a window read only that
window's files (the date filter prunes partitions, the timestamp filter row groups);
the (partition, offset) pair gives the arrival order the live job sees.
"""

from __future__ import annotations

import os
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.engine.events import parse_variant
from spark_jobs.engine.values import field, timestamp_ms

TABLE_ENV = "RULES_ARCHIVE_TABLE"
PARTITION_COLUMNS = ["topic", "date"]
# The live job's arrival order (spark_jobs/streaming/job.py::_input): partition in the
# high bits, offset in the low 40.
SEQ_SHIFT = 40

# Parquet row groups of the archive's files, in bytes as Parquet's writer buffers them
# (~5.5 MB on disk for the benchmark's events). Spark splits a Parquet scan by row
# group, so a window is read by as many tasks as it has row groups. At Parquet's default
# (128 MB), a 1M-event hour compacted by OPTIMIZE was one file of one row group: one
# task read it while the other core waited, so a backtest over it was slower than over
# the same events compacted in 8 MB row groups. Smaller groups also give the window's
# time bounds finer statistics to skip by.
ROW_GROUP_BYTES = 8 << 20


def write_conf(row_group_bytes: int = ROW_GROUP_BYTES) -> dict[str, str]:
    """Session settings under which the archive's files are written (the archive job)
    and rewritten (OPTIMIZE). A session setting, which Spark copies into the Hadoop
    configuration of every write, reaches Delta's Parquet writer; it holds for
    `executeCompaction`, which takes no writer options."""
    return {"parquet.block.size": str(row_group_bytes)}


def default_table() -> str:
    """$RULES_ARCHIVE_TABLE, else `var/archive/events` of the work folder (the folder
    `rulectl up` uses by default), resolved against the current directory."""
    return os.environ.get(TABLE_ENV) or str(Path("var") / "archive" / "events")


def archive_columns(records: DataFrame, time_field: str) -> DataFrame:
    """Kafka source rows (key, value, topic, partition, offset, timestamp) -> table rows.

    The event is parsed here once (the engine's own parse: `parse_variant`), and its
    time with the engine's own timestamp rules, so what a backtest reads is what the
    live job would have computed."""
    v = parse_variant(F.col("value").cast("string"))
    return records.select(
        F.col("topic"),
        F.to_date(F.col("timestamp")).alias("date"),
        F.col("partition").cast("int").alias("partition"),
        F.col("offset").cast("long").alias("offset"),
        F.col("timestamp"),
        F.col("key"),
        F.col("value"),
        v.alias("v"),
        timestamp_ms(field(v, time_field)).alias("ts_ms"),
        F.current_timestamp().alias("archived_at"),
    )


def seq_column() -> Column:
    """Arrival order as the live job numbers it."""
    return F.col("partition").cast("long") * F.lit(1 << SEQ_SHIFT) + F.col("offset")


def exists(spark: SparkSession, table: str) -> bool:
    """Whether `table` is a Delta table. Asked of Spark, not of a local file system or
    DeltaTable's JVM handle: it works the same on a Spark Connect session, whose server
    may see other paths than this process."""
    from pyspark.errors import AnalysisException

    try:
        spark.read.format("delta").load(table).schema  # noqa: B018 - resolves the table
    except AnalysisException:
        return False
    return True


_RELATIVE = re.compile(r"^\s*-\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def parse_time(text: str, now: datetime | None = None) -> datetime:
    """`--from`/`--to`: ISO-8601 (UTC without an offset), `now`, or relative to now
    (`-1h`, `-30m`, `-2d`, `-90s`, `-1w`)."""
    now = now or datetime.now(UTC)
    t = text.strip()
    if t.lower() == "now":
        return now
    m = _RELATIVE.match(t)
    if m:
        return now - timedelta(**{_UNITS[m.group(2)]: float(m.group(1))})
    try:
        parsed = datetime.fromisoformat(t.replace("Z", "+00:00"))
    except ValueError as exc:
        raise ValueError(f"not an ISO-8601 time or a relative time like -1h: {text!r}") from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


_HOUR_MS = 3_600_000


def read_window(
    spark: SparkSession,
    table: str,
    start: datetime,
    end: datetime,
    topics: list[str] | None = None,
) -> DataFrame:
    """The table's records with a broker timestamp in [start, end), of `topics` (all
    when None): pruned by the partition columns (topic, date), then by timestamp."""
    df = spark.read.format("delta").load(table)
    start_utc, end_utc = start.astimezone(UTC), end.astimezone(UTC)
    # The date partition of the broker timestamp: prunes whole directories.
    df = df.filter(F.col("date").between(F.lit(start_utc.date()), F.lit(end_utc.date())))
    if topics is not None:
        df = df.filter(F.col("topic").isin(sorted(set(topics))))
    # Epoch ms, not a Python datetime literal (PySpark reads a naive one in the local
    # zone of the Python process).
    lo, hi = int(start_utc.timestamp() * 1000), int(end_utc.timestamp() * 1000)
    # Delta skips the files whose timestamps are all outside these bounds. They are
    # rounded out to whole hours because Spark writes a timestamp literal into the
    # generated code of the stage that reads, filters and parses the records: with the
    # exact bounds, a window that moves (`--from -1h`, the DAGs' last N hours) made that
    # code new at every backtest, compiled again by Janino and then by the JIT, on a
    # warm server too, which a backtest over a moving window paid every time.
    lo_h, hi_h = lo - lo % _HOUR_MS, hi + (-hi) % _HOUR_MS
    df = df.filter(
        (F.col("timestamp") >= F.timestamp_millis(F.lit(lo_h))) & (F.col("timestamp") < F.timestamp_millis(F.lit(hi_h)))
    )
    # The exact bounds come as data (a one-row relation, broadcast), which the generated
    # code reads instead of embedding: the same code for every window within those hours.
    # (An inline table is a local relation: no job builds it, unlike createDataFrame's
    # Python rows.)
    bounds = spark.sql(f"SELECT * FROM VALUES (timestamp_millis({lo}L), timestamp_millis({hi}L)) "
                       "AS bounds(_window_lo, _window_hi)")
    inside = (F.col("timestamp") >= F.col("_window_lo")) & (F.col("timestamp") < F.col("_window_hi"))
    return df.join(F.broadcast(bounds), inside).drop("_window_lo", "_window_hi")


def engine_input(window: DataFrame) -> DataFrame:
    """Table rows -> what the engine reads (spark_jobs.engine.events): topic, seq, raw,
    proc_ms, and the already-parsed `v` (so `events.with_reasons`, not `classify`, is
    applied: nothing is parsed again)."""
    return window.select(
        "topic",
        seq_column().alias("seq"),
        F.col("value").cast("string").alias("raw"),
        F.unix_millis("timestamp").alias("proc_ms"),
        "v",
    )
