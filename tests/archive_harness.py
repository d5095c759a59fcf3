"""Drive the real archive job (`rulectl archive`, its own process and Spark) against a
real broker: start, watch its status file, SIGTERM or SIGKILL, restart on the same
checkpoint. Built on DetectJob's process handling (tests/detect_harness.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from confluent_kafka import Producer
from detect_harness import DetectJob
from pyspark.errors import AnalysisException

from spark_jobs.archive.table import PARTITION_COLUMNS, archive_columns
from spark_jobs.kafka.admin import TopicSpec, create_topics

_KAFKA_ROWS = "topic string, partition int, offset long, timestamp timestamp, key binary, value binary"


def write_records(spark, table: Path | str, records: list[tuple[str, int, datetime, bytes]],
                  time_field: str = "timestamp") -> None:
    """Append (topic, offset, broker time, value) records to a Delta archive table as
    the archive job writes them (Kafka partition 0, no key): a table without a broker."""
    df = spark.createDataFrame([(topic, 0, offset, at, None, value) for topic, offset, at, value in records], _KAFKA_ROWS)
    archive_columns(df, time_field).write.format("delta").mode("append").partitionBy(*PARTITION_COLUMNS).save(
        str(table))


class ArchiveJob(DetectJob):
    """`rulectl archive` as a subprocess; the status/wait/kill helpers are DetectJob's."""

    def __init__(self, bootstrap: str, workdir: Path, topics: list[str], time_field: str = "timestamp",
                 trigger_ms: int = 1000, max_offsets_per_trigger: int = 100_000) -> None:
        super().__init__(bootstrap, workdir, trigger_ms=trigger_ms, max_offsets_per_trigger=max_offsets_per_trigger)
        self.table = workdir / "archive" / "events"
        self.checkpoint = workdir / "archive" / "checkpoint"
        self.topics = topics
        self.time_field = time_field
        self.log = workdir / "archive.log"

    def start(self, timeout: float = 180) -> dict:
        if self.status_file.exists():
            self.status_file.unlink()
        cmd = [sys.executable, "-m", "spark_jobs.cli", "archive", "--bootstrap", self.bootstrap,
               "--table", str(self.table), "--checkpoint", str(self.checkpoint), "--time-field", self.time_field,
               "--trigger-ms", str(self.trigger_ms), "--max-offsets-per-trigger", str(self.max_offsets_per_trigger)]
        for t in self.topics:
            cmd += ["--topic", t]
        log = self.log.open("ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        return self.wait_for(lambda s: s.get("state") == "running", timeout)


def produce_keyed(bootstrap: str, topic: str, records: list[tuple[str, str]], partitions: int = 2) -> None:
    """Produce (key, value) records in order, confirmed; the topic is created first.
    One key's records land in one partition, in order (the arrival order live sees)."""
    create_topics(bootstrap, {topic: TopicSpec(partitions=partitions)})
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    errors: list[str] = []
    for key, value in records:
        p.produce(topic, value=value.encode(), key=key.encode(),
                  on_delivery=lambda err, _msg: errors.append(str(err)) if err else None)
        p.poll(0)
    assert p.flush(30) == 0 and not errors, errors


def logged_rows(table: Path) -> int | None:
    """Rows of the Delta table's live files, from the numRecords its log writes with each
    file (Python, no Spark job: what a poll needs; the answer is confirmed by Spark).
    None when a file came without statistics."""
    live: dict[str, int | None] = {}
    log = table / "_delta_log"
    for commit in sorted(log.glob("*.json")) if log.is_dir() else []:
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action:
                live[action["add"]["path"]] = json.loads(action["add"].get("stats") or "{}").get("numRecords")
            elif "remove" in action:
                live.pop(action["remove"]["path"], None)
    return None if None in live.values() else sum(live.values())  # type: ignore[arg-type]


def wait_rows(spark, table: Path, pred, timeout: float = 120):
    """Poll the Delta table until `pred(count)`; (count, seconds waited). The poll reads
    the log (logged_rows); Spark's count of the table has the last word."""
    started = time.time()
    n = -1
    while time.time() - started < timeout:
        logged = logged_rows(table)
        if logged is None or pred(logged):
            try:
                n = spark.read.format("delta").load(str(table)).count()
            except AnalysisException:
                # `_delta_log/` is created before its first commit is written: between
                # the two, Delta says DELTA_TABLE_NOT_FOUND. Not yet, then.
                n = -1
            if pred(n):
                return n, time.time() - started
        time.sleep(0.5)
    raise TimeoutError(f"archive table has {n} rows; condition not met in {timeout}s")
