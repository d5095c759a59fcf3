"""How long the real-time lane's batches last: a threshold rule change waits for the next
batch, so the default keeps a change within a second of its publish (half a second of
batch, plus the registry's read and the lane's first event), and `rulectl detect
--lane-batch-ms` lets an operator trade that wait for an idle lane's CPU. Spark refuses
a real-time batch shorter than its minimum setting (5 s by default), which the lane
lowers to its own length."""

from __future__ import annotations

import argparse

import pytest

from spark_jobs.commands import detect
from spark_jobs.streaming import threshold_lane
from spark_jobs.streaming.job import DetectConfig
from spark_jobs.streaming.quarantine import Quarantine


class _Writer:
    """The part of a DataStreamWriter the lane calls: records what it was given."""

    def __init__(self) -> None:
        self.calls: dict[str, object] = {}

    def option(self, key: str, value: str) -> _Writer:
        self.calls[f"option:{key}"] = value
        return self

    def outputMode(self, mode: str) -> _Writer:  # noqa: N802 - pyspark's name
        self.calls["outputMode"] = mode
        return self

    def trigger(self, **kw: str) -> _Writer:
        self.calls["trigger"] = kw
        return self

    def queryName(self, name: str) -> _Writer:  # noqa: N802 - pyspark's name
        self.calls["queryName"] = name
        return self

    def start(self) -> dict[str, object]:
        return self.calls


class _Conf:
    def __init__(self) -> None:
        self.values: dict[str, str] = {}

    def set(self, key: str, value: str) -> None:
        self.values[key] = value


class _Spark:
    def __init__(self) -> None:
        self.conf = _Conf()


def _started(monkeypatch: pytest.MonkeyPatch, cfg: DetectConfig, tmp_path) -> tuple[dict, dict]:  # noqa: ANN001
    monkeypatch.setattr(threshold_lane, "lane_records", lambda *a, **kw: None)
    monkeypatch.setattr(threshold_lane, "write_stream", lambda *a, **kw: _Writer())
    spark = _Spark()
    calls = threshold_lane.start_lane(spark, cfg, ["events.raw"], "detector", Quarantine(tmp_path, "lane"))
    return calls, spark.conf.values


def _parsed(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rulectl")
    detect.register(parser.add_subparsers())
    return parser.parse_args(["detect", *argv])


def test_the_lane_runs_half_second_batches_by_default(monkeypatch, tmp_path):
    cfg = DetectConfig(checkpoint=tmp_path, threshold_lane="real-time", lane_batch_ms=_parsed().lane_batch_ms)
    calls, conf = _started(monkeypatch, cfg, tmp_path)
    assert calls["trigger"] == {"realTime": "500 milliseconds"}
    assert conf == {"spark.sql.streaming.realTimeMode.minBatchDuration": "500"}


def test_an_operator_sets_the_lanes_batch(monkeypatch, tmp_path):
    cfg = DetectConfig(checkpoint=tmp_path, threshold_lane="real-time",
                       lane_batch_ms=_parsed("--lane-batch-ms", "2000").lane_batch_ms)
    calls, conf = _started(monkeypatch, cfg, tmp_path)
    assert calls["trigger"] == {"realTime": "2000 milliseconds"}
    assert conf == {"spark.sql.streaming.realTimeMode.minBatchDuration": "2000"}


@pytest.mark.parametrize(("given", "reason"), [("50", "must be 100 to 600000 ms, not 50"),
                                                ("1.5", "not a whole number of milliseconds: '1.5'"),
                                                ("600001", "must be 100 to 600000 ms, not 600001")])
def test_a_batch_length_out_of_bounds_is_refused(capsys, given, reason):
    with pytest.raises(SystemExit) as exit_:
        _parsed("--lane-batch-ms", given)
    assert exit_.value.code == 2
    assert f"argument --lane-batch-ms: {reason}" in capsys.readouterr().err
