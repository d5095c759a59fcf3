"""`rulectl demo`: feed the platform a live, realistic event stream with known patterns.

Without `--replay` it runs the endless mix of spark_jobs.demo.generator (background
traffic plus an injected seed pattern every `--pattern-every` seconds, each announced on
the console with the rule it should trigger). With `--replay` it produces the demo
history (the backtest's recording) once, moved to now, so the live job can be compared
with the backtest on the same scenarios. Ctrl-C / SIGTERM stop it cleanly: the records
already handed to the producer are flushed before it exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from datetime import UTC, datetime

from spark_jobs.commands.signals import install_handlers as _install_handlers
from spark_jobs.commands.signals import restore_handlers as _restore_handlers
from spark_jobs.demo.generator import (
    CONTEXT_TOPIC,
    EVENTS_TOPIC,
    KafkaSink,
    LiveMix,
    ProduceStats,
    produce_records,
    replay_records,
)
from spark_jobs.kafka.admin import create_topics

# An event source: with SASL on it authenticates as `producer` (writes the source topics only).
ROLE = "producer"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="produce a live demo event stream (or replay the demo history) to Kafka",
        description=__doc__.splitlines()[0],
    )
    p.add_argument(
        "--bootstrap",
        default=os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
        help="Kafka bootstrap servers",
    )
    p.add_argument("--rate", type=float, default=20.0, help="background events per second (default: 20)")
    length = p.add_mutually_exclusive_group()
    length.add_argument("--duration", type=float, default=None, metavar="S", help="stop after S seconds")
    length.add_argument(
        "--forever", action="store_true", help="run until Ctrl-C / SIGTERM (the default without --duration)"
    )
    p.add_argument(
        "--replay", action="store_true", help="produce the demo history once, shifted to now, then exit"
    )
    p.add_argument(
        "--fast",
        action="store_true",
        help="with --replay: produce as fast as possible, not at event-time pace",
    )
    p.add_argument("--seed", type=int, default=None, help="random seed: the same seed gives the same records")
    p.add_argument(
        "--pattern-every",
        type=float,
        default=10.0,
        metavar="S",
        help="seconds between injected patterns (0: none)",
    )
    p.add_argument(
        "--malformed-every",
        type=float,
        default=20.0,
        metavar="S",
        help="mean seconds between malformed lines (0: none)",
    )
    p.add_argument("--events-topic", default=EVENTS_TOPIC, help=f"events topic (default: {EVENTS_TOPIC})")
    p.add_argument("--context-topic", default=CONTEXT_TOPIC, help=f"context topic (default: {CONTEXT_TOPIC})")
    p.add_argument("--quiet", action="store_true", help="print only the final summary")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.rate <= 0:
        print("rulectl demo: --rate must be positive", file=sys.stderr)
        return 2
    if args.duration is not None and args.duration <= 0:
        print("rulectl demo: --duration must be positive", file=sys.stderr)
        return 2
    if args.fast and not args.replay:
        print("rulectl demo: --fast only applies to --replay", file=sys.stderr)
        return 2

    try:
        # Fail fast on a wrong address (a producer would otherwise retry silently), and
        # create the two topics if missing (idempotent: existing topics are untouched).
        create_topics(args.bootstrap, [args.events_topic, args.context_topic], timeout=15.0, role=ROLE)
    except Exception as exc:  # KafkaException, RuntimeError: the broker is not reachable
        print(f"rulectl demo: cannot reach Kafka at {args.bootstrap}: {exc}", file=sys.stderr)
        return 1

    stop = threading.Event()
    previous = _install_handlers(stop)
    try:
        sink = KafkaSink(args.bootstrap, role=ROLE)
        start = datetime.now(UTC)
        out = None if args.quiet else sys.stdout
        if args.replay:
            records = replay_records(start, args.events_topic, args.context_topic)
            mode = "replaying the demo history" + (" (fast)" if args.fast else " at event-time pace")
            _say(
                out,
                f"demo: {mode}: {len(records)} records to {args.events_topic}, {args.context_topic} on {args.bootstrap}",
            )
            stats = produce_records(records, sink, pace=not args.fast, stop=stop, out=out)
        else:
            mix = LiveMix(
                args.rate,
                args.seed,
                start,
                pattern_every=args.pattern_every,
                malformed_every=args.malformed_every,
                events_topic=args.events_topic,
                context_topic=args.context_topic,
            )
            until = args.duration
            length = f"for {until:g}s" if until is not None else "until Ctrl-C"
            _say(
                out,
                f"demo: {args.rate:g} events/s to {args.events_topic}, {args.context_topic} on {args.bootstrap}, {length}",
            )
            stats = produce_records(mix, sink, pace=True, until=until, stop=stop, out=out)
        return _finish(sink, stats)
    finally:
        _restore_handlers(previous)


def _finish(sink: KafkaSink, stats: ProduceStats) -> int:
    """Flush what was produced; a record the broker never acknowledged is a failure."""
    remaining = sink.flush(30.0)
    print(f"demo: produced {stats.summary()}", flush=True)
    if remaining or sink.errors:
        detail = sink.last_error or f"{remaining} record(s) unacknowledged after 30s"
        print(
            f"rulectl demo: delivery failed for {sink.errors + remaining} record(s): {detail}",
            file=sys.stderr,
        )
        return 1
    return 0


def _say(out: object, text: str) -> None:
    if out is not None:
        print(text, flush=True)


