"""Backtests on a warm Spark: `rulectl connect` (a Spark Connect server with the
platform's jars and settings) and `rulectl backtest --remote` give the detections a
local session gives, for file inputs and for the event archive."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from detect_harness import wait_port

from spark_jobs.backtest.inputs import InputSpec
from spark_jobs.backtest.runner import BacktestConfig, HistoryWindow, run_backtest
from spark_jobs.kafka.broker import free_port

pytestmark = [pytest.mark.spark, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "tests" / "data" / "demo"


def _ids(out: Path) -> list[str]:
    return sorted(json.loads(x)["detection_id"] for x in (out / "detections.jsonl").read_text().splitlines())


def test_backtest_on_a_spark_connect_server_equals_a_local_one(spark, tmp_path):
    from test_archive_quality import write_archive

    inputs = ["--input", f"events.raw={DEMO / 'events.raw.jsonl'}", "--input", f"context.raw={DEMO / 'context.raw.jsonl'}"]
    run_backtest(spark, BacktestConfig(ROOT / "rules", [InputSpec("events.raw", str(DEMO / "events.raw.jsonl")),
                                                        InputSpec("context.raw", str(DEMO / "context.raw.jsonl"))],
                                       tmp_path / "local"))
    table = tmp_path / "archive"
    write_archive(spark, table, {t: (DEMO / f"{t}.jsonl").read_text().splitlines() for t in ("events.raw", "context.raw")})
    run_backtest(spark, BacktestConfig(ROOT / "rules", [], tmp_path / "local_archive",
                                       history=HistoryWindow(
                                           str(table), *_last_hour())))

    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "spark_jobs.cli", "connect", "--port", str(port)],
                              stdout=(tmp_path / "connect.log").open("wb"), stderr=subprocess.STDOUT)
    try:
        wait_port(port, server, "rulectl connect")
        # The server is a batch JVM: the platform's options are on its command line.
        jvm = [c.cmdline() for c in psutil.Process(server.pid).children(recursive=True)
               if c.name() == "java" and any(a.endswith(".SparkConnectServer") for a in c.cmdline())]
        assert len(jvm) == 1 and {"-XX:-DontCompileHugeMethods", "-XX:+UseParallelGC"} <= set(jvm[0])
        remote = ["--remote", f"sc://127.0.0.1:{port}"]
        cmd = [sys.executable, "-m", "spark_jobs.cli", "backtest", "--rules", str(ROOT / "rules"), *remote]
        timings = []
        for name, args in (("files", inputs), ("files2", inputs), ("archive", ["--history", str(table), "--from", "-1h"])):
            t0 = time.time()
            done = subprocess.run([*cmd, *args, "--out", str(tmp_path / name)], capture_output=True, text=True,
                                  timeout=600)
            timings.append((name, round(time.time() - t0, 1)))
            assert done.returncode == 0, done.stderr[-3000:]
        print(f"\nbacktests on the Connect server (process wall, s): {timings}")
    finally:
        server.terminate()
        server.wait(60)
    assert _ids(tmp_path / "files") == _ids(tmp_path / "files2") == _ids(tmp_path / "local")
    assert _ids(tmp_path / "archive") == _ids(tmp_path / "local_archive")
    assert _ids(tmp_path / "local")


def _last_hour():
    from datetime import UTC, datetime, timedelta

    now = datetime.now(UTC)
    return now - timedelta(hours=1), now + timedelta(minutes=1)
