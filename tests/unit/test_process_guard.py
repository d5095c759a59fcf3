"""The process guard (tests/process_guard.py) fails a test that starts a JVM or Airflow
without the marker: pytest runs test files written here, with only the guard as plugin."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from process_guard import classify

TESTS = Path(__file__).resolve().parents[1]


def _pytest(tmp_path: Path, source: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(source))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "process_guard", "-p", "no:cacheprovider", "-q", "-rfE",
         "-W", "ignore::pytest.PytestUnknownMarkWarning",
         "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )


def test_unmarked_starts_fail_before_the_process_exists(tmp_path: Path) -> None:
    """Each of these would start a JVM or Airflow; the guard refuses them in the test's
    process, so none starts (nothing here needs the outer test to carry a marker)."""
    out = _pytest(tmp_path, f"""
        import subprocess, sys
        import pytest

        def test_java():
            subprocess.run(["java", "-version"], capture_output=True)

        def test_an_error_the_code_swallows():
            try:
                subprocess.check_call("cd / && exec java -version", shell=True)
            except Exception:
                pass

        def test_the_broker():
            from spark_jobs.kafka.broker import EmbeddedBroker, free_port
            EmbeddedBroker(port=free_port()).start()

        @pytest.mark.spark
        def test_a_spark_test_starting_the_broker():
            from spark_jobs.kafka.broker import EmbeddedBroker, free_port
            EmbeddedBroker(port=free_port()).start()

        def test_airflow():
            subprocess.run([{str(Path(sys.executable).parent / "airflow")!r}, "version"])

        def test_spark_through_a_fixture(session):
            pass

        @pytest.fixture
        def session():
            from pyspark.sql import SparkSession
            return SparkSession.builder.master("local[1]").getOrCreate()

        def test_nothing_started():
            subprocess.run(["true"], check=True)
        """)
    text = out.stdout + out.stderr
    assert out.returncode == 1, text
    assert "5 failed, 1 passed, 1 error" in text, text
    for name, needs in [("test_java", "@pytest.mark.spark or @pytest.mark.kafka"),
                        ("test_an_error_the_code_swallows", "@pytest.mark.spark or @pytest.mark.kafka"),
                        ("test_the_broker", "@pytest.mark.kafka"),
                        ("test_a_spark_test_starting_the_broker", "@pytest.mark.kafka"),
                        ("test_airflow", "@pytest.mark.airflow")]:
        assert f"test_inner.py::{name} started " in text and needs in text, (name, text)
    # Refused at setup (the conftest's `spark` fixture would have marked its users spark).
    assert "test_spark_through_a_fixture started Spark (a JVM) (subprocess: " in text, text
    assert "(subprocess: java -version)" in text, text


def test_a_module_that_starts_a_jvm_when_imported_fails_its_collection(tmp_path: Path) -> None:
    out = _pytest(tmp_path, """
        import subprocess
        subprocess.run(["java", "-version"])

        def test_x():
            pass
        """)
    assert out.returncode == 2 and "the collection (a module that starts it when imported) started a JVM" in out.stdout


@pytest.mark.spark
def test_a_jvm_started_by_a_child_process_fails_the_test(tmp_path: Path) -> None:
    """A real JVM in a grandchild (as `rulectl detect` in a subprocess would start):
    seen in the process tree. The JVM waits for its pause file to be removed, so it is
    there while the guard looks; it is a JVM this test starts, hence its marker."""
    out = _pytest(tmp_path, """
        import subprocess, sys, time
        import pytest

        def _jvm_in_a_child(tmp_path):
            code = ("import subprocess; subprocess.run(['java', '-XX:+UnlockDiagnosticVMOptions', "
                    "'-XX:+PauseAtStartup', '-version'], capture_output=True)")
            child = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path)
            deadline = time.monotonic() + 60
            while not list(tmp_path.glob("vm.paused.*")) and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)
            for f in tmp_path.glob("vm.paused.*"):
                f.unlink()
            assert child.wait(60) == 0

        def test_unmarked(tmp_path):
            _jvm_in_a_child(tmp_path)

        @pytest.mark.kafka
        def test_marked(tmp_path):
            _jvm_in_a_child(tmp_path)
        """)
    text = out.stdout + out.stderr
    assert "1 failed, 1 passed" in text, text
    assert "test_inner.py::test_unmarked started a JVM (process " in text and "-XX:+PauseAtStartup" in text, text


@pytest.mark.parametrize(("argv", "kind"), [
    (["/usr/lib/jvm/java-17/bin/java", "-cp", "x", "kafka.Kafka", "server.properties"], "kafka"),
    (["java", "-cp", "/a/kafka-clients.jar", "org.apache.spark.deploy.SparkSubmit", "x.py"], "spark"),
    (["/bin/bash", "/venv/lib/pyspark/bin/spark-submit", "--master", "local[2]"], "spark"),
    (["/venv/bin/python", "/venv/bin/airflow", "api-server"], "airflow"),
    (["airflow scheduler -- DagFileProcessorManager"], "airflow"),
    (["python3", "-m", "airflow", "db", "migrate"], "airflow"),
    (["/usr/bin/mvn", "-q", "package"], "jvm"),
    (["/bin/sh", "-c", "cd /x && java -version"], "jvm"),
    (["/venv/bin/python", "-m", "pytest", "-m", "airflow"], None),
    (["ls", "airflow"], None),
    (["git", "status"], None),
])
def test_what_a_command_line_starts(argv: list[str], kind: str | None) -> None:
    assert classify(argv) == kind
