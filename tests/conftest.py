"""Shared fixtures. Each section belongs to one area; keep them delimited."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))  # tests/ helpers (reference_engine, ...)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
# The lifecycle reads the event archive when its table exists (history_source "auto"):
# a checkout where `rulectl up` ran has one under var/. Tests read their own files unless
# they name a table.
os.environ.setdefault("RULES_ARCHIVE_TABLE", str(ROOT / ".no-archive-in-tests"))
# Every JVM the tests start (Spark sessions, spark-submit jobs, brokers, Connect servers)
# inherits this and compiles with C1 only. A test's JVM lives seconds to minutes on a few
# hundred records, where C2's compiler threads cost more CPU than their code saves, and
# the suite's JVMs share two cores; the JIT tier changes no result. A JAVA_TOOL_OPTIONS
# of your own replaces it (set it empty for HotSpot's default).
os.environ.setdefault("JAVA_TOOL_OPTIONS", "-XX:TieredStopAtLevel=1")

# ----------------------------------------------------------------------------- Spark


@pytest.fixture(scope="session")
def spark():
    """One local Spark session for the whole run (start-up costs ~10 s on 2 cores)."""
    from spark_jobs.spark import session

    s = session("rule-platform-tests", master="local[2]", shuffle_partitions=2)
    yield s
    s.stop()


@pytest.fixture(scope="session")
def demo_inputs() -> dict[str, Path]:
    d = ROOT / "tests" / "data" / "demo"
    return {"events.raw": d / "events.raw.jsonl", "context.raw": d / "context.raw.jsonl"}


# ----------------------------------------------------------------------------- Spark Connect


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    """`rulectl connect`, as a user (or `rulectl up`) starts it: one server for a module's
    backtests, each a client of it instead of a Spark of its own."""
    import subprocess

    import psutil
    from detect_harness import wait_port

    from spark_jobs.kafka.broker import free_port

    port = free_port()
    log = tmp_path_factory.mktemp("connect") / "connect.log"
    server = subprocess.Popen([sys.executable, "-m", "spark_jobs.cli", "connect", "--port", str(port)],
                              stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        wait_port(port, server, "rulectl connect")
        # The server is a batch JVM: the platform's options are on its command line.
        jvm = [c.cmdline() for c in psutil.Process(server.pid).children(recursive=True)
               if c.name() == "java" and any(a.endswith(".SparkConnectServer") for a in c.cmdline())]
        assert len(jvm) == 1 and {"-XX:-DontCompileHugeMethods", "-XX:+UseParallelGC"} <= set(jvm[0])
        yield f"sc://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(60)


# ----------------------------------------------------------------------------- Kafka (embedded broker)
# Owned by the Kafka I/O area (spark_jobs/kafka). Tests that use `kafka_broker` are
# marked `kafka` automatically, so `pytest -m "not kafka"` skips them.


@pytest.fixture(scope="session")
def kafka_broker():
    """A real Apache Kafka broker (KRaft) on a free port with the platform's default topics (2 partitions each)."""
    from spark_jobs.kafka.broker import EmbeddedBroker, free_port

    broker = EmbeddedBroker(port=free_port(), partitions=2).start()
    yield broker
    broker.stop()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "kafka_broker" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.kafka)
    _longest_files_first(items)


# The suite's longest files (each several minutes of a worker). Without xdist they run
# first. Under `make test` (`-n 2 --dist loadfile`) xdist then sorts the files by their
# number of tests (its default `--loadscope-reorder`, a stable sort), so this order only
# decides among files with as many tests. Handing the longest files out first
# (`--no-loadscope-reorder`) was tried and reverted: two clean-clone runs were slower
# than xdist's order (docs/benchmarks.md, bench_suite_cpu rows of 2026-12-03).
# Only the order of files changes; each file's tests keep theirs.
LONGEST_FILES = (
    "test_conformance.py", "test_platform_up.py", "test_airflow_release.py", "test_archive.py",
    "test_scale_out.py", "test_live_backtest_parity.py", "test_archive_maintenance.py",
    "test_detection_job.py", "test_supervision_across_hosts.py", "test_kafka_cluster.py",
)


def _longest_files_first(items) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


# ----------------------------------------------------------------------------- end Kafka


# ----------------------------------------------------------------------------- detection jobs


@pytest.fixture(scope="module", autouse=True)
def _no_detection_job_outlives_its_module():
    """A test that fails before it stops its job (tests/detect_harness.py) would leave it
    running, with its JVM, through every later test of the worker."""
    yield
    harness = sys.modules.get("detect_harness")
    if harness is not None:
        for job in [j for j in harness.STARTED if j.running()]:
            job.kill()
        harness.STARTED.clear()


# ----------------------------------------------------------------------------- process guard
# A test that starts a JVM (Spark, the Kafka broker, Maven) or Airflow carries the marker
# (spark, kafka, airflow), so `-m "not spark and not kafka and not airflow"` starts none:
# tests/process_guard.py fails a test that starts one without it.


def pytest_configure(config):
    import process_guard

    if not config.pluginmanager.has_plugin("process_guard"):
        config.pluginmanager.register(process_guard, "process_guard")


# ----------------------------------------------------------------------------- end process guard
