"""`rulectl archive`: the continuous Kafka -> Delta Lake archive of the event topics.

A Structured Streaming query reads the event topics with Spark's Kafka connector and
appends every record to the archive table (`spark_jobs.archive.table`), parsed once.

Exactly once by checkpoint: the query's checkpoint holds the Kafka offsets of each
micro-batch before it runs, and Delta's sink commits each batch with the query id and
batch id in the same atomic log entry as its files (a `SetTransaction`). A batch that a
crash (SIGKILL) interrupts runs again at the next start, from the same offsets; if its
commit had already reached the table, Delta recognises the (query, batch) pair and
writes nothing. So every record is in the table once, however the job stops
(`tests/integration/test_archive.py` kills it mid-stream and counts).

The job writes a status file (state, query id, last batch, rows, rates) like the
detection job, so `rulectl up` and people can see it is alive.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from spark_jobs.kafka.spark_io import read_stream

log = logging.getLogger(__name__)

# The platform's event topics (what rules read); the internal topics (rules, detections,
# dead letters, status, routing) are not events and are not archived.
DEFAULT_TOPICS: tuple[str, ...] = ("events.raw", "context.raw")
# The Kafka principal the archive reads as (spark_jobs.kafka.security): read-only on
# every topic; it never writes to Kafka nor creates topics (its exact-name pattern
# subscription picks a topic up, from its start, once it exists).
ROLE = "reader"


@dataclass
class ArchiveConfig:
    bootstrap: str = "127.0.0.1:9092"
    table: str = "var/archive/events"
    checkpoint: Path = Path("var/archive/checkpoint")
    topics: tuple[str, ...] = DEFAULT_TOPICS
    time_field: str = "timestamp"
    # A batch commits to the Delta log, and Delta's commit work (the new snapshot, its
    # statistics, a checkpoint every tenth commit) costs the same for ten records as for
    # ten thousand: at the demo's trickle a 5 s trigger kept 0.6 of a core busy, 30 s
    # 0.17 (tests/benchmarks/bench_idle_platform.py). History may lag the live topics by
    # one trigger; backtests and warm windows read Kafka past the archive's end.
    trigger_ms: int = 30_000
    max_offsets_per_trigger: int = 200_000
    starting_offsets: str = "earliest"
    master: str | None = None
    status_file: Path | None = None
    extra_conf: dict[str, str] = field(default_factory=dict)

    @property
    def status_path(self) -> Path:
        return self.status_file or self.checkpoint / "status.json"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _Status:
    """status.json, rewritten atomically: what a supervisor and a person look at."""

    def __init__(self, cfg: ArchiveConfig) -> None:
        self.cfg = cfg
        self.data: dict = {"job": "archive", "state": "starting", "table": str(cfg.table),
                           "checkpoint": str(cfg.checkpoint), "topics": list(cfg.topics),
                           "started_at": _iso(time.time()), "rows_archived": 0}

    def update(self, **values: object) -> None:
        self.data.update(values)
        self.data["updated_at"] = _iso(time.time())
        path = self.cfg.status_path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=2) + "\n")
        tmp.replace(path)


def start_query(spark: object, cfg: ArchiveConfig) -> object:
    """The streaming query (started): Kafka -> archive_columns -> Delta, append."""
    from spark_jobs.archive.table import PARTITION_COLUMNS, archive_columns

    records = read_stream(spark, cfg.bootstrap, cfg.topics, starting_offsets=cfg.starting_offsets,
                          max_offsets_per_trigger=cfg.max_offsets_per_trigger, role=ROLE)
    return (
        archive_columns(records, cfg.time_field)
        .writeStream.format("delta")
        .outputMode("append")
        .partitionBy(*PARTITION_COLUMNS)
        .option("checkpointLocation", str(cfg.checkpoint))
        .queryName("event-archive")
        .trigger(processingTime=f"{int(cfg.trigger_ms)} milliseconds")
        .start(str(cfg.table))
    )


def run(cfg: ArchiveConfig, stop: threading.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT (or `stop`); 0 on a requested stop, 1 when the query
    failed (the supervisor restarts the job; the checkpoint makes that safe)."""
    from spark_jobs.archive.table import write_conf
    from spark_jobs.spark import local_checkpoint_conf, session

    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    cfg.checkpoint.mkdir(parents=True, exist_ok=True)
    status = _Status(cfg)
    status.update()
    # The archive's row groups (table.write_conf) unless the settings' own conf says otherwise.
    spark = session("event-archive", master=cfg.master,
                    extra={**local_checkpoint_conf(cfg.master), **write_conf(), **cfg.extra_conf}, streaming=True)
    query = start_query(spark, cfg)
    status.update(state="running", query_id=str(query.id), run_id=str(query.runId))
    log.info("archive job started: query %s, %s -> %s", query.id, ",".join(cfg.topics), cfg.table)
    last_batch = None
    rows = 0
    try:
        while query.isActive and not stop.is_set():
            stop.wait(0.5)
            p = query.lastProgress
            if p is not None and p.get("batchId") != last_batch:
                last_batch = p.get("batchId")
                rows += int(p.get("numInputRows") or 0)
                status.update(last_batch_id=last_batch, last_batch_at=p.get("timestamp"),
                              last_batch_rows=p.get("numInputRows"), rows_archived=rows,
                              input_rows_per_s=p.get("inputRowsPerSecond"),
                              processed_rows_per_s=p.get("processedRowsPerSecond"))
        if query.isActive:
            # Interrupting a batch is safe (it runs again at the next start and Delta
            # skips a batch it already committed), so no wait for the batch in flight.
            query.stop()
        error = query.exception()
    finally:
        if query.isActive:
            query.stop()
    if error is not None:
        log.error("archive query failed: %s", error)
        status.update(state="failed", error=str(error)[:2000])
        return 1
    status.update(state="stopped")
    return 0
