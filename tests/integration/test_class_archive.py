"""The platform's JVMs map the class archive set-up wrote (spark_jobs/jvm/class_archive.py):
the archive file is among the memory mappings of a Spark session's JVM, a streaming
job's (the detection and archive jobs: the platform's jar on their class path) and a
broker's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from spark_jobs.jvm.class_archive import archive_path, ensure_archive

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


def _mapped(pid: int) -> set[str]:
    return {line.split()[-1] for line in Path(f"/proc/{pid}/maps").read_text().splitlines() if "/" in line}


def test_a_spark_session_jvm_maps_the_archive(spark) -> None:
    path = ensure_archive("spark")
    assert path is not None and path == archive_path("spark")
    assert str(path) in _mapped(spark.sparkContext._gateway.proc.pid)


def test_a_streaming_jobs_jvm_maps_the_archive() -> None:
    """The session `rulectl detect` and `rulectl archive` start, in a process of its own:
    HotSpot refuses the archive (and says so on the job's log) when the class path does
    not begin as the archive's did."""
    path = ensure_archive("spark")
    script = ("from spark_jobs.spark import local_checkpoint_conf, session\n"
              "s = session('cds-streaming', streaming=True, extra=local_checkpoint_conf(None))\n"
              "print(open(f'/proc/{s.sparkContext._gateway.proc.pid}/maps').read())\n"
              "s.stop()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    mapped = {line.split()[-1] for line in done.stdout.splitlines() if "/" in line}
    assert str(path) in mapped, done.stderr[-3000:]


def test_a_broker_jvm_maps_the_archive(kafka_broker) -> None:
    path = ensure_archive("broker")
    assert path is not None
    assert str(path) in _mapped(kafka_broker.pid)
