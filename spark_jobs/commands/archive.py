"""`rulectl archive`: the continuous archive of the event topics into a Delta table
(`spark_jobs.archive.job`); `rulectl archive --maintain` runs retention and compaction
once (what the `archive_maintenance` DAG schedules)."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from spark_jobs.archive.job import DEFAULT_TOPICS, ArchiveConfig


def _settings() -> object:
    """The lifecycle settings for defaults (table, time field, retention); a bad
    environment value must not break every other rulectl command's parser."""
    from spark_jobs.lifecycle.settings import LifecycleSettings, resolve_settings

    try:
        return resolve_settings(use_airflow=False)
    except (ValueError, TypeError):
        return LifecycleSettings()


def register(sub: argparse._SubParsersAction) -> None:
    s = _settings()
    p = sub.add_parser("archive", help="archive the event topics into a Delta Lake table (until SIGTERM)")
    p.add_argument("--bootstrap", default="127.0.0.1:9092")
    p.add_argument("--table", default=s.archive_table, help=f"Delta table path (default: {s.archive_table})")
    p.add_argument("--checkpoint", type=Path, default=None, help="default: TABLE/../checkpoint")
    p.add_argument("--status-file", type=Path, default=None, help="default: CHECKPOINT/status.json")
    p.add_argument("--topic", action="append", dest="topics", metavar="TOPIC",
                   help=f"topic to archive (repeatable; default: {', '.join(DEFAULT_TOPICS)})")
    p.add_argument("--time-field", default=s.time_field, help="event field holding the event time")
    p.add_argument("--trigger-ms", type=int, default=ArchiveConfig.trigger_ms,
                   help=f"micro-batch trigger interval (default: {ArchiveConfig.trigger_ms} ms)")
    p.add_argument("--max-offsets-per-trigger", type=int, default=200_000)
    p.add_argument("--master", default=None)
    p.add_argument("--maintain", action="store_true",
                   help="instead of archiving: delete partitions past retention, OPTIMIZE, VACUUM, then exit")
    p.add_argument("--retention-days", type=float, default=s.archive_retention_days)
    p.add_argument("--vacuum-hours", type=float, default=s.archive_vacuum_hours)
    p.set_defaults(func=run)


def checkpoint_for(table: str) -> Path:
    """The archive's checkpoint beside its table (`.../archive/events` -> `.../archive/checkpoint`)."""
    return Path(table).resolve().parent / "checkpoint"


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.maintain:
        from spark_jobs.archive.maintenance import maintain
        from spark_jobs.spark import session

        spark = session("archive-maintenance", master=args.master)
        print(json.dumps(maintain(spark, args.table, args.retention_days, args.vacuum_hours)))
        return 0
    from spark_jobs.archive.job import run as run_job

    cfg = ArchiveConfig(
        bootstrap=args.bootstrap, table=str(Path(args.table).resolve()),
        checkpoint=args.checkpoint or checkpoint_for(args.table), topics=tuple(args.topics or DEFAULT_TOPICS),
        time_field=args.time_field, trigger_ms=args.trigger_ms, max_offsets_per_trigger=args.max_offsets_per_trigger,
        master=args.master, status_file=args.status_file,
    )
    return run_job(cfg)
