"""How long a source's Kafka fetch waits at the broker for records, per query.

The micro-batch reads bounded ranges, where a fetch past the range's end must not hold
the batch (10 ms); the real-time lane's tasks poll for as long as their batch lasts,
where a short wait is a fetch every 10 ms per idle partition (bench_lane_idle.py: the
broker's cores), and a long one costs no latency because the broker answers a waiting
fetch as soon as a record arrives (bench_lanes.py)."""

from __future__ import annotations

import pytest

from spark_jobs.streaming import job


class _Stop(Exception):
    pass


def _source_options_of(monkeypatch, cfg: job.DetectConfig, *, real_time: bool) -> tuple[dict, dict]:
    """The options `_input` gives `read_stream`, and the Kafka source's options they make."""
    from spark_jobs.kafka.spark_io import _source_options

    seen: dict = {}

    def fake_read_stream(spark, bootstrap, topics, **kw):  # noqa: ANN001, ANN003
        seen["given"] = dict(kw["options"] or {})
        seen["source"] = _source_options(bootstrap, topics, kw["starting_offsets"], kw["options"], kw["role"])
        raise _Stop

    monkeypatch.setattr(job, "read_stream", fake_read_stream)
    with pytest.raises(_Stop):
        job._input(None, cfg, ["events.raw"], real_time=real_time)
    return seen["given"], seen["source"]


@pytest.mark.parametrize(("real_time", "wait_ms"), [(False, "10"), (True, "500")])
def test_each_query_waits_its_own_time_for_a_fetch(monkeypatch, real_time, wait_ms):
    _, source = _source_options_of(monkeypatch, job.DetectConfig(), real_time=real_time)
    assert source["kafka.fetch.max.wait.ms"] == wait_ms
    assert source["failOnDataLoss"] == "true"


def test_allow_data_loss_is_kept_beside_the_lanes_wait(monkeypatch):
    given, _ = _source_options_of(monkeypatch, job.DetectConfig(fail_on_data_loss=False), real_time=True)
    assert given == {"failOnDataLoss": "false", "kafka.fetch.max.wait.ms": "500"}
