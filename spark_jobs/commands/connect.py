"""`rulectl connect`: a Spark Connect server with the platform's session settings, kept
running so that backtests (`rulectl backtest --remote sc://127.0.0.1:15002`) skip the
JVM start-up and run on an already warm JIT: measured on the 2-core machine under load,
a cold `rulectl backtest` of 1k events took 111 s, the same backtest on a warm server
27-39 s (README, Benchmarks). `rulectl up` starts one."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path

from spark_jobs.spark import DEFAULT_CONNECT_PORT, connect_server_argv


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("connect", help="run a Spark Connect server for backtests (until Ctrl-C)")
    p.add_argument("--port", type=int, default=DEFAULT_CONNECT_PORT)
    p.add_argument("--master", default="local[2]")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import pyspark

    env = {**os.environ, "SPARK_HOME": str(Path(pyspark.__file__).parent), "PYSPARK_PYTHON": sys.executable}
    proc = subprocess.Popen(connect_server_argv(args.port, args.master), env=env)
    print(f"Spark Connect server on sc://127.0.0.1:{args.port} (pid {proc.pid})", flush=True)

    def forward(signum: int, _frame: object) -> None:
        proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    return proc.wait()
