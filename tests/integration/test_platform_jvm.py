"""The JVM a platform session starts really runs with the platform's options
(spark_jobs.spark.jvm_options): batch sessions on HotSpot's throughput collector."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.spark]


def test_a_batch_session_runs_the_parallel_collector(spark):
    jvm = spark.sparkContext._jvm
    collectors = {b.getName() for b in jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()}
    # HotSpot names the parallel collector's young and old generation collectors so;
    # G1's are "G1 Young Generation" and "G1 Old Generation".
    assert collectors == {"PS Scavenge", "PS MarkSweep"}
    args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert "-XX:-DontCompileHugeMethods" in args
