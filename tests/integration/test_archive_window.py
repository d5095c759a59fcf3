"""Reading a window of the event archive (`archive.table.read_window`) on real Spark and
Delta Lake: only the window's files are read, and listing them is a small job."""

from __future__ import annotations

import json
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from archive_harness import write_records
from py4j.protocol import Py4JJavaError
from pyspark.sql import functions as F

from spark_jobs.archive.table import read_window

pytestmark = [pytest.mark.spark]

DAY = datetime(2026, 3, 10, tzinfo=UTC)
TOPICS = ("a.raw", "b.raw")


def _write_table(spark, table: Path) -> list[tuple[str, datetime, int]]:
    """Three days of two topics, a record every six hours, as `rulectl archive` writes
    them; returns (topic, broker time, n) of every record."""
    records = []
    for topic in TOPICS:
        for i in range(12):
            at = DAY - timedelta(days=1) + timedelta(hours=6 * i)
            records.append((topic, at, i))
    write_records(spark, table, [(topic, n, at, json.dumps({"n": n, "ts": at.isoformat()}).encode())
                                 for topic, at, n in records], "ts")
    return records


def test_a_window_reads_only_its_topic_and_date_partitions(spark, tmp_path):
    table = tmp_path / "archive"
    records = _write_table(spark, table)
    # Every data file outside (topic a.raw, the middle day) is deleted: a read that
    # still opened one would fail, so the count below proves the pruning.
    kept = table / "topic=a.raw" / f"date={DAY.date().isoformat()}"
    removed = 0
    for part in table.glob("topic=*/date=*"):
        if part != kept:
            shutil.rmtree(part)
            removed += 1
    assert removed == 5 and kept.is_dir()

    window = read_window(spark, str(table), DAY + timedelta(hours=3), DAY + timedelta(hours=19), ["a.raw"])
    got = sorted(json.loads(r.value)["n"] for r in window.select(F.col("value").cast("string").alias("value")).collect())
    want = sorted(n for topic, at, n in records
                  if topic == "a.raw" and DAY + timedelta(hours=3) <= at < DAY + timedelta(hours=19))
    assert got == want == [5, 6, 7]  # not 4: 00:00 is in the day, not in the window
    with pytest.raises(Py4JJavaError, match="FILE_NOT_EXIST"):  # the files are gone indeed
        spark.read.format("delta").load(str(table)).collect()


def test_listing_a_windows_files_is_a_small_job(spark, tmp_path):
    """Delta lists a read's files with a Spark job over the table's cached state, in 50
    partitions by default: 50 tasks of a few rows, most of a second of a small backtest
    on two cores. The platform's sessions keep that state in 2."""
    table = tmp_path / "archive"
    _write_table(spark, table)
    sc = spark.sparkContext
    sc.setJobGroup("archive-window-listing", "read_window")
    try:
        assert read_window(spark, str(table), DAY, DAY + timedelta(days=1), ["a.raw"]).count() == 4
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    tracker = sc.statusTracker()
    stages = [sid for jid in tracker.getJobIdsForGroup("archive-window-listing")
              for sid in tracker.getJobInfo(jid).stageIds]
    tasks = [info.numTasks for info in map(tracker.getStageInfo, stages) if info is not None]
    assert tasks, "no job ran for the read"
    assert max(tasks) <= 2, tasks


def test_a_window_is_exact_to_the_millisecond(spark, tmp_path):
    table = tmp_path / "archive"
    _write_table(spark, table)
    ms = timedelta(milliseconds=1)
    window = read_window(spark, str(table), DAY + timedelta(hours=6) + ms, DAY + timedelta(hours=18), ["a.raw"])
    got = [json.loads(r.value)["n"] for r in window.select(F.col("value").cast("string").alias("value")).collect()]
    assert got == [6]  # 12:00 only: 06:00 is a millisecond early, 18:00 is the end (exclusive)
    window = read_window(spark, str(table), DAY + timedelta(hours=6), DAY + timedelta(hours=18) + ms, ["a.raw"])
    got = sorted(json.loads(r.value)["n"] for r in window.select(F.col("value").cast("string").alias("value")).collect())
    assert got == [5, 6, 7]


def _generated_code(spark, df) -> list[str]:
    """The Java source Spark generates for the executed plan's whole-stage stages."""
    df.collect()  # adaptive execution: the final plan exists once it has run
    plan = df._jdf.queryExecution().executedPlan()
    stages = spark.sparkContext._jvm.org.apache.spark.sql.execution.debug.package.codegenStringSeq(plan)
    return [stages.apply(i)._2() for i in range(stages.size())]


def test_windows_that_move_within_the_hour_share_their_generated_code(spark, tmp_path):
    """A backtest over the last hour (`--from -1h`) reads a window that moves from run to
    run. Spark writes a timestamp literal into the generated code of the stage that reads
    and parses the records, so with the exact bounds as literals that code was new at
    every run: compiled again, then run slower until the JIT had compiled it again."""
    table = tmp_path / "archive"
    _write_table(spark, table)

    def code(start: datetime, end: datetime) -> list[str]:
        window = read_window(spark, str(table), start, end, ["a.raw"])
        return _generated_code(spark, window.select(F.length("value").alias("n"), "offset"))

    first = code(DAY + timedelta(hours=3, minutes=10), DAY + timedelta(hours=19, minutes=10))
    moved = code(DAY + timedelta(hours=3, minutes=11, seconds=7), DAY + timedelta(hours=19, minutes=11, seconds=7))
    assert first and moved == first
