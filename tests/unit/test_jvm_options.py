"""The JVM options every platform JVM starts with (spark_jobs.spark.jvm_options): batch
JVMs on the throughput collector, streaming jobs on G1, the caller's own options kept."""

from __future__ import annotations

import pytest

from spark_jobs.spark import connect_server_argv, jvm_options

SIDES = ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions")


@pytest.fixture(autouse=True)
def _no_class_archive(monkeypatch):
    """The options below are those of a machine without a class archive (see the last test)."""
    monkeypatch.setenv("RULES_CDS", "off")


def test_a_batch_jvm_gets_the_huge_method_option_and_the_parallel_collector():
    conf = jvm_options({"spark.app.name": "x"})
    assert conf["spark.app.name"] == "x"
    for key in SIDES:
        assert conf[key].split() == ["-XX:-DontCompileHugeMethods", "-XX:+UseParallelGC"]


def test_a_streaming_jvm_keeps_the_default_collector():
    conf = jvm_options({}, streaming=True)
    for key in SIDES:
        assert conf[key] == "-XX:-DontCompileHugeMethods"


def test_the_callers_options_follow_ours_so_theirs_win():
    conf = jvm_options({"spark.driver.extraJavaOptions": "-Dx=1 -XX:+DontCompileHugeMethods"})
    assert conf["spark.driver.extraJavaOptions"].split() == [
        "-XX:-DontCompileHugeMethods", "-XX:+UseParallelGC", "-Dx=1", "-XX:+DontCompileHugeMethods"]


@pytest.mark.parametrize("chosen", ["-XX:+UseG1GC", "-XX:+UseZGC", "-XX:+UseSerialGC", "-XX:+UseShenandoahGC"])
def test_a_collector_the_caller_chose_is_the_only_one(chosen):
    """HotSpot will not start with two collectors selected."""
    conf = jvm_options({"spark.executor.extraJavaOptions": f"-Xss4m {chosen}"})
    assert conf["spark.executor.extraJavaOptions"].split() == ["-XX:-DontCompileHugeMethods", "-Xss4m", chosen]
    assert "-XX:+UseParallelGC" in conf["spark.driver.extraJavaOptions"]


def test_the_connect_server_that_runs_backtests_is_a_batch_jvm():
    argv = connect_server_argv(extra={"spark.driver.extraJavaOptions": "-Dy=2"})
    confs = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--conf")
    assert confs["spark.driver.extraJavaOptions"].split() == [
        "-XX:-DontCompileHugeMethods", "-XX:+UseParallelGC", "-Dy=2"]


def test_the_class_archive_comes_first_where_set_up_wrote_one(monkeypatch, tmp_path):
    monkeypatch.delenv("RULES_CDS")
    monkeypatch.setenv("RULES_JARS_DIR", str(tmp_path))
    from spark_jobs.jvm.class_archive import archive_path

    path = archive_path("spark")
    assert path is not None and path.parent == tmp_path / "cds"
    assert jvm_options({})[SIDES[0]].split()[0] != f"-XX:SharedArchiveFile={path}"  # none written yet
    path.parent.mkdir()
    path.write_bytes(b"")
    for conf in (jvm_options({}), jvm_options({}, streaming=True)):
        for key in SIDES:
            assert conf[key].split()[0] == f"-XX:SharedArchiveFile={path}"
    monkeypatch.setenv("RULES_CDS", "off")
    assert "SharedArchiveFile" not in jvm_options({})[SIDES[0]]
    monkeypatch.setenv("RULES_CDS_DUMP", f"spark:{tmp_path / 'new.jsa'}")
    monkeypatch.delenv("RULES_CDS")
    assert jvm_options({})[SIDES[0]].split()[0] == f"-XX:ArchiveClassesAtExit={tmp_path / 'new.jsa'}"


def test_the_platforms_jar_heads_every_class_path_the_archive_was_written_with(monkeypatch, tmp_path):
    """HotSpot maps a class archive only into a JVM whose class path begins as the
    archive's did. The streaming jobs need the platform's jar on their class path (their
    local file system), so it comes first for every platform Spark JVM, before any
    class path the caller gives, the cluster's daemons included, and the archive's
    name changes with it."""
    from spark_jobs.jvm.class_archive import archive_path
    from spark_jobs.platform.spark_cluster import LocalSparkCluster

    monkeypatch.setenv("RULES_JARS_DIR", str(tmp_path))
    monkeypatch.delenv("SPARK_DAEMON_CLASSPATH", raising=False)
    assert "spark.driver.extraClassPath" not in jvm_options({})  # not built: nothing to put first
    without = archive_path("spark")
    jar = tmp_path / "spark" / "rule-platform-keyed-operator.jar"
    jar.parent.mkdir()
    jar.write_bytes(b"PK")
    for conf in (jvm_options({}), jvm_options({}, streaming=True)):
        assert (conf["spark.driver.extraClassPath"], conf["spark.executor.extraClassPath"]) == (str(jar), str(jar))
    given = jvm_options({"spark.driver.extraClassPath": f"/opt/a.jar:{jar}"})
    assert given["spark.driver.extraClassPath"] == f"{jar}:/opt/a.jar"
    assert LocalSparkCluster(tmp_path / "cluster")._env()["SPARK_DAEMON_CLASSPATH"] == str(jar)
    assert archive_path("spark") != without
