"""The platform's JVMs map the class archive set-up wrote (spark_jobs/jvm/class_archive.py):
the archive file is among the memory mappings of a Spark session's JVM and a broker's."""

from __future__ import annotations

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


def test_a_broker_jvm_maps_the_archive(kafka_broker) -> None:
    path = ensure_archive("broker")
    assert path is not None
    assert str(path) in _mapped(kafka_broker.pid)
