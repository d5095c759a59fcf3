"""The backtest's parsed events are kept as a leaf of the rules' plans, and a backtest
leaves nothing kept behind (spark_jobs/backtest/kept.py), on a real Spark session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from spark_jobs.backtest.inputs import InputSpec
from spark_jobs.backtest.kept import kept
from spark_jobs.backtest.runner import BacktestConfig, run_backtest

pytestmark = pytest.mark.spark
ROOT = Path(__file__).resolve().parents[2]


def persistent_rdds(spark) -> set[int]:
    """Ids of the RDDs the SparkContext keeps (persisted, local checkpoints included)."""
    return {int(i) for i in spark.sparkContext._jsc.getPersistentRDDs().keySet()}


def cached_rdd_blocks(spark, rdd_id: int) -> int:
    infos = spark.sparkContext._jsc.sc().getRDDStorageInfo()
    return sum(i.numCachedPartitions() for i in infos if i.id() == rdd_id)


@pytest.fixture
def text_events(spark, tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps({"user": f"u{i % 7}", "amount": i}) + "\n" for i in range(500)))
    return spark.read.text(str(path)).select(F.col("value").alias("raw"), F.length("value").alias("n"))


def test_plans_over_the_kept_events_do_not_hold_the_plan_that_made_them(spark, text_events):
    def analyzed(df) -> str:
        return df.filter(F.col("n") > 3).select("raw")._jdf.queryExecution().analyzed().toString()

    assert "Relation [value" in analyzed(text_events)  # the file's scan, as read
    with kept(text_events) as events:
        plan = analyzed(events)
    assert "LogicalRDD" in plan
    assert "Relation [value" not in plan


def test_the_kept_events_are_computed_once_and_released_at_the_end(spark, text_events):
    before = persistent_rdds(spark)
    with kept(text_events) as events:
        assert events.count() == 500
        (rdd,) = persistent_rdds(spark) - before
        assert cached_rdd_blocks(spark, rdd) > 0
        # A later action reads the kept blocks: the same rows, nothing read again.
        assert events.filter(F.col("raw").contains('"u3"')).count() == len([i for i in range(500) if i % 7 == 3])
    assert persistent_rdds(spark) - before == set()
    assert cached_rdd_blocks(spark, rdd) == 0


def test_a_backtest_leaves_nothing_kept(spark, demo_inputs, tmp_path):
    """The parsed events, the routed events of `hashtag_velocity` (emit_to_sink false) and the
    output lines are all kept during the run; none of them after it."""
    cache = spark._jsparkSession.sharedState().cacheManager()
    before, cached_before = persistent_rdds(spark), cache.isEmpty()
    cfg = BacktestConfig(ROOT / "rules", [InputSpec(t, str(p)) for t, p in demo_inputs.items()], tmp_path)
    summary = run_backtest(spark, cfg)
    assert summary["rules"]["hashtag_velocity"]["routed"] > 0
    assert persistent_rdds(spark) - before == set()
    assert cache.isEmpty() == cached_before
