"""tests/benchmarks/bench_suite_cpu.py: which component a process's CPU is counted under."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_suite_cpu import Seen, component  # noqa: E402

PY = "/work/.venv/bin/python3"


@pytest.mark.parametrize(("cmdline", "expected"), [
    ("airflow scheduler", "Airflow: scheduler"),
    (f"{PY} /work/.venv/bin/airflow dag-processor", "Airflow: DAG processor"),
    ("airflow api-server --port 8080", "Airflow: API server"),
    ("airflow triggerer", "Airflow: triggerer"),
    ("airflow worker -- LocalExecutor: <idle>", "Airflow: executor"),
    ("airflow task supervisor: ['airflow', 'tasks', 'run', 'rule_release']", "Airflow: tasks"),
    ("airflow task runner: rule_release validate manual__2026", "Airflow: tasks"),
    (f"{PY} /work/.venv/bin/airflow dags test rule_release -c {{}}", "Airflow: dags test"),
    (f"{PY} -m pytest -n 2 tests", "pytest workers"),
    (f"{PY} -m spark_jobs.cli up --workdir var", "rulectl (Python)"),
])
def test_processes_are_counted_by_what_they_are(cmdline: str, expected: str) -> None:
    assert component(Seen(1, cmdline, 0.0), {}) == expected


def test_a_spark_jvm_is_counted_under_who_started_it() -> None:
    job = Seen(1, f"{PY} -m spark_jobs.cli detect --bootstrap x", 0.0)
    jvm = Seen(2, "/usr/bin/java -cp x org.apache.spark.deploy.SparkSubmit pyspark-shell", 0.0)
    assert component(jvm, {2: job}) == "Spark: detection job"
