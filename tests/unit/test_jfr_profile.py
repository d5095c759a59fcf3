"""tests/benchmarks/jfr_profile.py: reading `jfr print` and counting methods per thread group."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import jfr_profile  # noqa: E402

# Two samples as `jfr print --events jdk.ExecutionSample` writes them (abridged).
PRINTED = """jdk.ExecutionSample {
  startTime = 07:37:05.123 (2026-12-03)
  sampledThread = "Executor task launch worker for task 1.0 in stage 5.0 (TID 7)" (javaThreadId = 93)
  state = "STATE_RUNNABLE"
  stackTrace = [
    java.util.HashMap.get(Object) line: 556
    org.rocksdb.RocksDB.get(long, byte[]) line: 10
    org.apache.spark.sql.execution.streaming.state.RocksDB.get(byte[], String) line: 380
    org.apache.spark.sql.execution.streaming.state.RocksDB.get(byte[], String) line: 381
    ...
  ]
}

jdk.ExecutionSample {
  startTime = 07:37:05.133 (2026-12-03)
  sampledThread = "stream execution thread for keyed [id = 1]" (javaThreadId = 70)
  state = "STATE_RUNNABLE"
  stackTrace = [
    org.codehaus.janino.UnitCompiler.compile2(Java$CompilationUnit) line: 1
    scala.collection.immutable.List.foreach(Function1) line: 2
  ]
}
"""

GROUPS = (("Executor task", "tasks"), ("stream executio", "query_driver"))


def test_samples_are_read_with_their_thread_and_frames_top_first() -> None:
    samples = jfr_profile.parse(PRINTED)
    assert [t for t, _ in samples] == ["Executor task launch worker for task 1.0 in stage 5.0 (TID 7)",
                                       "stream execution thread for keyed [id = 1]"]
    assert samples[0][1] == ["java.util.HashMap.get", "org.rocksdb.RocksDB.get",
                             "org.apache.spark.sql.execution.streaming.state.RocksDB.get",
                             "org.apache.spark.sql.execution.streaming.state.RocksDB.get"]
    assert samples[1][1] == ["org.codehaus.janino.UnitCompiler.compile2", "scala.collection.immutable.List.foreach"]


def test_a_method_counts_once_per_sample_and_only_focus_packages_count() -> None:
    samples = jfr_profile.parse(PRINTED) + [("Executor task launch worker (TID 8)", ["java.lang.Thread.run"])]
    out = jfr_profile.summarize(samples, GROUPS)
    assert list(out) == ["tasks", "query_driver"]  # most samples first
    assert out["tasks"]["samples"] == 2
    # The recursive RocksDB.get is on one of the two task samples' stacks: half, not one.
    assert dict(out["tasks"]["methods"]) == {"org.rocksdb.RocksDB.get": 0.5,
                                             "org.apache.spark.sql.execution.streaming.state.RocksDB.get": 0.5}
    assert out["query_driver"]["samples"] == 1
    assert out["query_driver"]["methods"] == [("org.codehaus.janino.UnitCompiler.compile2", 1.0)]


def test_the_innermost_focus_frame_says_where_a_sample_lands() -> None:
    samples = jfr_profile.parse(PRINTED) + [("Executor task launch worker (TID 8)", ["java.lang.Thread.run"])]
    out = jfr_profile.summarize(samples, GROUPS)
    # The task sample's first focus frame below HashMap.get (a JDK frame) is RocksDB's
    # JNI call, not Spark's wrapper above it; the sample with no focus frame lands nowhere.
    assert out["tasks"]["innermost"] == [("org.rocksdb.RocksDB.get", 0.5)]
    assert out["query_driver"]["innermost"] == [("org.codehaus.janino.UnitCompiler.compile2", 1.0)]
