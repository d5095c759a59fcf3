"""Which bucketing a checkpoint's keyed state is under (job.key_bucketing): a new
checkpoint records balanced buckets over the session's shuffle partitions and keeps
them whatever the session says later (its keys' state is under those buckets)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from spark_jobs.streaming.job import DEFAULT_KEY_BUCKETS, DetectConfig, key_bucketing
from spark_jobs.streaming.jvm_operator import KeyBucketing


def _session(shuffle_partitions: int) -> SimpleNamespace:
    conf = {"spark.sql.shuffle.partitions": str(shuffle_partitions)}
    return SimpleNamespace(conf=SimpleNamespace(get=conf.get))


def test_a_new_checkpoint_balances_over_the_sessions_partitions_and_keeps_them(tmp_path: Path):
    cfg = DetectConfig(checkpoint=tmp_path / "cp")
    assert key_bucketing(cfg, _session(3)) == KeyBucketing(DEFAULT_KEY_BUCKETS, 3)
    (tmp_path / "cp" / "query").mkdir()  # the query ran on it
    assert key_bucketing(cfg, _session(8)) == KeyBucketing(DEFAULT_KEY_BUCKETS, 3)

