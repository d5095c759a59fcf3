"""`rulectl detect`: the continuous Spark Structured Streaming detection job."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from spark_jobs.archive.table import default_table
from spark_jobs.streaming.job import DetectConfig, run
from spark_jobs.streaming.threshold_lane import LANE_BATCH_MS

# Bounds of --lane-batch-ms: shorter batches spend the lane on starting them, longer ones
# hold a threshold rule change back for minutes.
MIN_LANE_BATCH_MS, MAX_LANE_BATCH_MS = 100, 600_000


def _batch_ms(text: str) -> int:
    try:
        ms = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of milliseconds: {text!r}") from None
    if not MIN_LANE_BATCH_MS <= ms <= MAX_LANE_BATCH_MS:
        raise argparse.ArgumentTypeError(f"must be {MIN_LANE_BATCH_MS} to {MAX_LANE_BATCH_MS} ms, not {ms}")
    return ms


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("detect", help="run the streaming detection job (until SIGTERM)")
    p.add_argument("--bootstrap", default="127.0.0.1:9092")
    p.add_argument("--sink-topic", default="events.processed")
    p.add_argument("--dead-letter-topic", default="events.deadletter")
    p.add_argument("--shadow-topic", default="events.shadow", help="detections of shadow rule versions")
    p.add_argument("--rules-topic", default="rules.active")
    p.add_argument("--warmup-topic", default="detect.warmup",
                   help="archived events replayed into the state of a rule that starts afresh (warm start)")
    p.add_argument("--archive", default=None,
                   help="the event archive (Delta table) warm starts read first; default: $RULES_ARCHIVE_TABLE or "
                        "var/archive/events; absent: warm starts read Kafka only")
    p.add_argument("--status-topic", default="detect.status")
    p.add_argument("--checkpoint", type=Path, default=Path("var/detect/checkpoint"))
    p.add_argument("--status-file", type=Path, default=None, help="default: CHECKPOINT/status.json")
    p.add_argument("--trigger-ms", type=int, default=500)
    p.add_argument("--max-offsets-per-trigger", type=int, default=100_000)
    p.add_argument("--starting-offsets", choices=["earliest", "latest"], default="earliest")
    p.add_argument("--master", default=None)
    p.add_argument("--threshold-lane", choices=["micro-batch", "real-time"], default="micro-batch",
                   help="where threshold rules run: in the keyed query's micro-batches, or in a query of their own "
                        "in Spark's real-time mode (one task per source partition, always running)")
    p.add_argument("--lane-batch-ms", type=_batch_ms, default=LANE_BATCH_MS,
                   help="how long the real-time lane's batches last: a threshold rule change waits for the next one, "
                        "and an idle lane's CPU grows with the batches per second (default: %(default)s)")
    p.add_argument("--allow-data-loss", action="store_true",
                   help="go on (from the earliest offset there is) when checkpointed offsets vanished or went back; "
                        "default: stop with Spark's data-loss error")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    cfg = DetectConfig(
        bootstrap=args.bootstrap, sink_topic=args.sink_topic, dead_letter_topic=args.dead_letter_topic,
        shadow_topic=args.shadow_topic, rules_topic=args.rules_topic, status_topic=args.status_topic, checkpoint=args.checkpoint,
        trigger_ms=args.trigger_ms, max_offsets_per_trigger=args.max_offsets_per_trigger,
        starting_offsets=args.starting_offsets, master=args.master, status_file=args.status_file,
        fail_on_data_loss=not args.allow_data_loss, threshold_lane=args.threshold_lane, lane_batch_ms=args.lane_batch_ms,
        warmup_topic=args.warmup_topic, archive=args.archive or default_table(),
    )
    return run(cfg)
