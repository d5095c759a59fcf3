"""Retention and compaction of the archive table (spark_jobs.archive.maintenance) on a
real Delta table, and the thin DAG that schedules it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

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


def test_archive_maintenance_dag_imports(tmp_path: Path) -> None:
    out = import_dag(tmp_path, "archive_maintenance")
    assert out == {"errors": {}, "tasks": {"maintain_archive": []}}
