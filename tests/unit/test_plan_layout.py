"""The plan layout a checkpoint was written by (job.plan_layout): a checkpoint of the
single-operator plan that routed velocity emits through Kafka has other sources and
stateful operators than the chained plan, so the job refuses it, clearly and before it
starts anything, instead of resuming state it cannot read."""

from __future__ import annotations

from pathlib import Path

import pytest

from spark_jobs.streaming.job import PLAN_LAYOUT, DetectConfig, plan_layout


def test_a_new_checkpoint_records_the_layout(tmp_path: Path):
    cfg = DetectConfig(checkpoint=tmp_path / "cp")
    assert plan_layout(cfg) == PLAN_LAYOUT
    assert (tmp_path / "cp" / "plan_layout").read_text() == PLAN_LAYOUT
    (tmp_path / "cp" / "query").mkdir()  # the query ran on it: it is still this layout's
    assert plan_layout(cfg) == PLAN_LAYOUT


def test_a_checkpoint_from_before_the_record_is_refused(tmp_path: Path):
    (tmp_path / "query").mkdir()
    with pytest.raises(ValueError, match="routed-topic.*new checkpoint"):
        plan_layout(DetectConfig(checkpoint=tmp_path))
    assert not (tmp_path / "plan_layout").exists()  # refused again at the next start


def test_another_recorded_layout_is_refused(tmp_path: Path):
    # chain-1: the three-scan plan before the one-line plan.
    (tmp_path / "plan_layout").write_text("chain-1")
    with pytest.raises(ValueError, match="chain-1"):
        plan_layout(DetectConfig(checkpoint=tmp_path))
