"""`rulectl runner`: run the detection job's driver on this host and keep it running.

`rulectl runner --bootstrap B [runner options] -- [rulectl detect options]` starts
`rulectl detect --bootstrap B ...`, restarts it after a crash (backoff; a crash loop
stops it, loudly) and on requests from the `detect.control` topic (graceful stop, same
checkpoint), and records every restart on `detect.restarts`. See
spark_jobs.platform.runner.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from pathlib import Path

from spark_jobs.commands.signals import install_handlers, restore_handlers
from spark_jobs.platform.runner import Runner, RunnerConfig


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runner", help="run `rulectl detect` on this host: restart on crash and on control requests")
    p.add_argument("--bootstrap", default="127.0.0.1:9092", help="Kafka bootstrap servers (also given to the job)")
    p.add_argument("--control-topic", default="detect.control")
    p.add_argument("--restarts-topic", default="detect.restarts")
    p.add_argument("--status-topic", default="detect.status", help="the job's and the runner's status topic")
    p.add_argument("--max-crashes", type=int, default=3,
                   help="crashes in a row, each soon after start, before giving up (default: 3)")
    p.add_argument("--healthy-after", type=float, default=120.0,
                   help="seconds a driver must run for its crash not to count toward a crash loop (default: 120)")
    p.add_argument("--backoff", type=float, default=2.0, help="first wait after a crash, doubled per crash (s)")
    p.add_argument("--max-backoff", type=float, default=60.0, help="longest wait after a crash (s)")
    p.add_argument("--graceful-timeout", type=float, default=120.0,
                   help="seconds the job may take to stop on SIGTERM before it is killed (default: 120)")
    p.add_argument("--log", type=Path, default=None, help="the driver's output (default: this terminal)")
    p.add_argument("detect_args", nargs=argparse.REMAINDER,
                   help="after `--`: options of `rulectl detect` (e.g. --master spark://h:7077 --checkpoint /shared/cp)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    detect_args = list(args.detect_args)
    if detect_args and detect_args[0] == "--":
        detect_args = detect_args[1:]
    if any(a == "--bootstrap" or a.startswith("--bootstrap=") for a in detect_args):
        print("rulectl runner: give --bootstrap to the runner (before --), it passes it on", file=sys.stderr)
        return 2
    if any(a == "--status-topic" or a.startswith("--status-topic=") for a in detect_args):
        print("rulectl runner: give --status-topic to the runner (before --), it passes it on", file=sys.stderr)
        return 2
    if args.max_crashes < 1:
        print("rulectl runner: --max-crashes must be at least 1", file=sys.stderr)
        return 2
    cfg = RunnerConfig(
        bootstrap=args.bootstrap, detect_args=detect_args, control_topic=args.control_topic,
        restarts_topic=args.restarts_topic, status_topic=args.status_topic, max_crashes=args.max_crashes,
        healthy_after_s=args.healthy_after, backoff_s=args.backoff, max_backoff_s=args.max_backoff,
        graceful_timeout_s=args.graceful_timeout, log_path=args.log,
    )
    stop = threading.Event()
    previous = install_handlers(stop)
    try:
        return Runner(cfg, stop).run()
    finally:
        restore_handlers(previous)
