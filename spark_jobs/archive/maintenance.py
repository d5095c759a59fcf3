"""Retention and compaction of the archive table (scheduled by the
`archive_maintenance` DAG, or `rulectl archive --maintain`).

The streaming writer adds a few small files per topic and date every trigger; OPTIMIZE
bin-packs them so a backtest opens tens of files, not thousands. Retention deletes
whole date partitions past `retention_days` (a metadata-only delete: the predicate is on
a partition column). VACUUM then removes the files no table version within
`vacuum_hours` still references, which is what frees the disk; time travel further back
than that is given up on purpose.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from spark_jobs.archive.table import ROW_GROUP_BYTES, write_conf
from spark_jobs.spark import session_conf

# Delta refuses VACUUM below 7 days unless its safety check is off; the archive has one
# writer (append-only) and backtests take minutes, so a shorter window is safe here.
_RETENTION_CHECK = "spark.databricks.delta.retentionDurationCheck.enabled"
# VACUUM lists the table's directories in a job of this many tasks, Spark's default
# 10,000 (and Delta's own listing conf 200): on a small cluster that is a minute of
# empty tasks for a table of a few dozen files (delta-io/delta#395). The archive's
# listing is sized like its shuffles, to the cluster.
_LISTING = ("spark.sql.sources.parallelPartitionDiscovery.parallelism",
            "spark.databricks.delta.vacuum.fileListing.parallelism")


def maintain(spark: SparkSession, table: str, retention_days: float, vacuum_hours: float,
             now: datetime | None = None, row_group_bytes: int = ROW_GROUP_BYTES) -> dict:
    """Delete partitions older than `retention_days`, OPTIMIZE (into row groups of
    `row_group_bytes`, see archive.table.ROW_GROUP_BYTES), VACUUM; a summary."""
    from delta.tables import DeltaTable

    started = time.time()
    now = now or datetime.now(UTC)
    if not DeltaTable.isDeltaTable(spark, table):
        return {"table": table, "skipped": "no archive table yet"}
    dt = DeltaTable.forPath(spark, table)
    cutoff = (now - timedelta(days=retention_days)).date()
    before = dt.toDF().filter(F.col("date") < F.lit(cutoff)).count()
    if before:
        dt.delete(F.col("date") < F.lit(cutoff))
    with session_conf(spark, write_conf(row_group_bytes)):
        compaction = dt.optimize().executeCompaction().collect()
    metrics = compaction[0]["metrics"] if compaction else None
    tasks = spark.conf.get("spark.sql.shuffle.partitions")
    with session_conf(spark, {_RETENTION_CHECK: "false", **dict.fromkeys(_LISTING, tasks)}):
        dt.vacuum(float(vacuum_hours))
    return {
        "table": table,
        "retention_cutoff": cutoff.isoformat(),
        "rows_deleted": before,
        "files_added": metrics["numFilesAdded"] if metrics else 0,
        "files_removed": metrics["numFilesRemoved"] if metrics else 0,
        "vacuum_hours": vacuum_hours,
        "version": dt.history(1).collect()[0]["version"],
        "duration_s": round(time.time() - started, 3),
    }
