"""`rulectl broker`: run the embedded Apache Kafka broker (KRaft) in the foreground.

The one-machine setup (and a developer's terminal) needs a broker without Docker: this
starts Kafka from its Maven jars with its log in `--data-dir` (kept across restarts),
creates the platform's topics, prints the bootstrap address and stays up until Ctrl-C /
SIGTERM, then stops the broker cleanly.
"""

from __future__ import annotations

import argparse
import sys
import threading

from spark_jobs.commands.signals import install_handlers as _install_handlers
from spark_jobs.commands.signals import restore_handlers as _restore_handlers
from spark_jobs.kafka.broker import DEFAULT_TOPICS, BrokerError, EmbeddedBroker


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("broker", help="run the embedded Apache Kafka broker (KRaft) until Ctrl-C")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=9092, help="listen port (default: 9092)")
    p.add_argument("--partitions", type=int, default=1, help="partitions per data topic (default: 1)")
    p.add_argument("--data-dir", default="var/kafka", help="the broker's log folder, kept across restarts (default: var/kafka)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.partitions < 1:
        print("rulectl broker: --partitions must be at least 1", file=sys.stderr)
        return 2
    stop = threading.Event()
    broker = EmbeddedBroker(port=args.port, host=args.host, topics=DEFAULT_TOPICS, partitions=args.partitions,
                            data_dir=args.data_dir)
    previous = _install_handlers(stop)
    try:
        broker.start()
    except BrokerError as exc:
        print(f"rulectl broker: {exc}", file=sys.stderr)
        _restore_handlers(previous)
        return 1
    try:
        print(f"broker ready on {broker.bootstrap} (pid {broker.pid}, log in {broker.data_dir})", flush=True)
        print(f"topics: {', '.join(DEFAULT_TOPICS)}", flush=True)
        print("press Ctrl-C to stop", flush=True)
        while not stop.wait(0.5):
            if not broker.is_running():
                print("rulectl broker: the broker process exited unexpectedly", file=sys.stderr)
                return 1
        print("stopping broker", flush=True)
        return 0
    finally:
        broker.stop()
        _restore_handlers(previous)


