"""Where a backtest may keep its events as a local checkpoint (spark_jobs/backtest/kept.py):
only a session (classic, or a Spark Connect server's) on a local master, whose executor
is the driver's JVM."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from spark_jobs.backtest.kept import checkpoint_is_safe


def frame(master: str) -> SimpleNamespace:
    """What checkpoint_is_safe reads of a DataFrame: its session's `spark.master`, which a
    classic session and a Spark Connect client both answer."""
    conf = SimpleNamespace(get=lambda key, default=None: master if key == "spark.master" else default)
    return SimpleNamespace(sparkSession=SimpleNamespace(conf=conf))


@pytest.mark.parametrize("master", ["local", "local[2]", "local[*]", "local[4,3]"])
def test_a_local_master_keeps_a_checkpoint(master):
    assert checkpoint_is_safe(frame(master))


@pytest.mark.parametrize("master", ["spark://host:7077", "local-cluster[2,1,1024]", "yarn", "k8s://https://k:443", ""])
def test_executors_that_can_be_lost_keep_a_cache(master):
    assert not checkpoint_is_safe(frame(master))
