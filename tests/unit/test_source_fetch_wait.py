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


@pytest.mark.parametrize(("real_time", "wait_ms"), [(False, "10"), (True, "500")])
def test_each_query_waits_its_own_time_for_a_fetch(monkeypatch, real_time, wait_ms):
    seen: dict = {}

    def fake_read_stream(spark, bootstrap, topics, **kw):  # noqa: ANN001, ANN003
        from spark_jobs.kafka.spark_io import _source_options

        seen.update(_source_options(bootstrap, topics, kw["starting_offsets"], kw["options"], kw["role"]))
        raise _Stop

    monkeypatch.setattr(job, "read_stream", fake_read_stream)
    with pytest.raises(_Stop):
        job._input(None, job.DetectConfig(), ["events.raw"], real_time=real_time)
    assert seen["kafka.fetch.max.wait.ms"] == wait_ms
    assert seen["failOnDataLoss"] == "true"


def test_allow_data_loss_is_kept_beside_the_lanes_wait(monkeypatch):
    seen: dict = {}

    def fake_read_stream(spark, bootstrap, topics, **kw):  # noqa: ANN001, ANN003
        seen.update(kw["options"])
        raise _Stop

    monkeypatch.setattr(job, "read_stream", fake_read_stream)
    with pytest.raises(_Stop):
        job._input(None, job.DetectConfig(fail_on_data_loss=False), ["events.raw"], real_time=True)
    assert seen == {"failOnDataLoss": "false", "kafka.fetch.max.wait.ms": "500"}
