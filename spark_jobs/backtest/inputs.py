"""Recorded topics for a backtest: `TOPIC=PATH` with PATH a JSON Lines file (or a
directory of them) or a directory of Parquet files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.engine.events import RAW_COLUMNS
from spark_jobs.engine.frames import union_all
from spark_jobs.spark import shuffle_partitions

# seq = input index in the high bits, then the file-order id Spark assigns; unique and
# increasing in file order within one input, which is the arrival order of a recording.
_SEQ_SHIFT = 52


class InputError(ValueError):
    pass


@dataclass(frozen=True)
class InputSpec:
    topic: str
    path: str

    @classmethod
    def parse(cls, text: str) -> InputSpec:
        topic, sep, path = text.partition("=")
        if not sep or not topic or not path:
            raise InputError(f"--input expects TOPIC=PATH, got {text!r}")
        return cls(topic.strip(), path.strip())

    @property
    def format(self) -> str:
        p = Path(self.path)
        if p.is_dir() and any(p.glob("*.parquet")):
            return "parquet"
        return "jsonl"


def read_input(spark: SparkSession, spec: InputSpec, index: int) -> DataFrame:
    """Raw records (RAW_COLUMNS) of one recorded topic; proc_ms is filled in later from
    the time field, since a file has no broker timestamp."""
    if not Path(spec.path).exists():
        raise InputError(f"input for topic {spec.topic!r}: no such file or directory: {spec.path}")
    if spec.format == "parquet":
        df = spark.read.parquet(spec.path)
        raw = F.to_json(F.struct(*[F.col(f"`{c}`") for c in df.columns]))
        df = df.select(raw.alias("raw"))
    else:
        # Hadoop's line reader ends a line at LF, CRLF or CR and strips the terminator.
        df = spark.read.text(spec.path).select(F.col("value").alias("raw"))
        df = df.filter(F.trim(F.col("raw")) != F.lit(""))  # blank lines are not records
    seq = F.lit(index).cast("long") * F.lit(1 << _SEQ_SHIFT) + F.monotonically_increasing_id()
    return df.select(
        F.lit(spec.topic).alias("topic"),
        seq.alias("seq"),
        "raw",
        F.lit(None).cast("long").alias("proc_ms"),
    ).select(*RAW_COLUMNS)


# What Spark packs into one read partition by default (spark.sql.files.maxPartitionBytes).
_PARTITION_BYTES = 128 * 1024 * 1024


def read_inputs(spark: SparkSession, specs: list[InputSpec]) -> DataFrame:
    """Every recorded topic as one DataFrame of raw records, in as many partitions as
    their size needs (at least the session's shuffle partitions).

    Each file is read as its own scan, so a recording of many small topics would be many
    tiny partitions, and every rule group scans the kept events once: forty topics of
    kilobytes made each group forty tasks. Coalescing keeps each file's records in order
    (partitions are merged, never split or reordered), so arrival order is unchanged."""
    raw = union_all([read_input(spark, s, i) for i, s in enumerate(specs)])
    size = sum(f.stat().st_size for s in specs for f in _files(Path(s.path)))
    return raw.coalesce(max(shuffle_partitions(spark), -(-size // _PARTITION_BYTES)))


def _files(p: Path) -> list[Path]:
    return [f for f in p.rglob("*") if f.is_file()] if p.is_dir() else [p]
