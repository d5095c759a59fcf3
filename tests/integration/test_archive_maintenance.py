"""Retention and compaction of the archive table (spark_jobs.archive.maintenance) on a
real Delta table, and the thin DAG that schedules it."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from archive_harness import write_records
from dag_import import import_dag
from pyspark.sql import functions as F

from spark_jobs.archive.maintenance import maintain

ROOT = Path(__file__).resolve().parents[2]


def _records(days_ago: list[int], per_write: int) -> list:
    now = datetime.now(UTC)
    return [("events.raw", i, now - timedelta(days=d), json.dumps({"i": i, "timestamp": 1}).encode())
            for d in days_ago for i in range(per_write)]


@pytest.mark.spark
def test_maintenance_deletes_old_partitions_compacts_and_vacuums(spark, tmp_path):
    table = str(tmp_path / "events")
    # Five small appends (as a streaming writer leaves them): two days past retention.
    for _ in range(5):
        write_records(spark, table, _records([0, 1, 40, 41], 3))
    df = spark.read.format("delta").load(table)
    assert df.count() == 60 and df.filter(F.col("ts_ms") == 1000).count() == 60
    files_before = len(spark.read.format("delta").load(table).inputFiles())

    result = maintain(spark, table, retention_days=30, vacuum_hours=0)
    after = spark.read.format("delta").load(table)
    assert result["rows_deleted"] == 30 and after.count() == 30
    cutoff = (datetime.now(UTC) - timedelta(days=30)).date()
    assert after.filter(F.col("date") < F.lit(cutoff)).count() == 0
    assert len(after.inputFiles()) < files_before  # OPTIMIZE: one file per remaining partition
    assert result["files_removed"] > result["files_added"] > 0
    # VACUUM with 0 hours: only the files of the current version are left on disk.
    on_disk = {str(p.resolve()) for p in Path(table).rglob("*.parquet")}
    assert on_disk == {f.removeprefix("file:") for f in after.inputFiles()}

    assert maintain(spark, str(tmp_path / "none"), 30, 0)["skipped"]


@pytest.mark.spark
def test_compaction_writes_row_groups_that_a_scan_can_split(spark, tmp_path):
    """OPTIMIZE rewrites a date partition into row groups of the archive's size
    (archive.table.ROW_GROUP_BYTES; 64 kB here so that the test's data is small), not
    Parquet's 128 MB: Spark splits a Parquet scan by row group, so a compacted window
    of one file is read by several tasks. The session's own setting is left as it was."""
    table = str(tmp_path / "events")
    now = datetime.now(UTC)
    for w in range(4):
        write_records(spark, table, [("events.raw", w * 500 + i, now,
                                      json.dumps({"i": i, "pad": os.urandom(300).hex()}).encode())
                                     for i in range(500)])
    spark.conf.unset("parquet.block.size")

    maintain(spark, table, retention_days=30, vacuum_hours=0, row_group_bytes=64 << 10)
    (path,) = spark.read.format("delta").load(table).inputFiles()
    groups = pq.ParquetFile(path.removeprefix("file:")).metadata.num_row_groups
    assert groups >= 4, groups
    assert spark.conf.get("parquet.block.size", None) is None


def test_archive_maintenance_dag_imports(tmp_path: Path) -> None:
    out = import_dag(tmp_path, "archive_maintenance")
    assert out == {"errors": {}, "tasks": {"maintain_archive": []}}
