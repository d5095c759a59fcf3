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


def test_a_session_without_the_platforms_jar_is_told_how_to_load_it(spark):
    """No silent switch to another evaluator: a class of the platform's jar that the
    session cannot find (as in a session built without the jar) is an error naming it
    and the way to load the jar."""
    from spark_jobs.spark import MissingJarError, jvm_class

    assert jvm_class(spark, "ruleplatform.keyed.BatchVelocity") is not None
    with pytest.raises(MissingJarError, match=r"ruleplatform\.keyed\.NoSuchPass .*spark_jobs\.spark\.session\(\)"):
        jvm_class(spark, "ruleplatform.keyed.NoSuchPass")
