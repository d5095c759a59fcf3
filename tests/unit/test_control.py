"""The supervisor's verdict over what it read from the control topics (pure)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from spark_jobs.platform.control import (
    ControlView,
    SupervisorPolicy,
    decide,
    match_restart_record,
    restart_request_records,
)

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def iso(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).isoformat().replace("+00:00", "Z")


def job(**kw) -> dict:
    base = {"state": "running", "updated_at": iso(1), "last_batch_time": iso(2), "lag": 0,
            "watermark_delay_s": 5, "rules_watermark_delay_s": 5, "restart_required": False}
    return {**base, **kw}


RUNNER = {"state": "running", "host": "driver-1", "updated_at": iso(1)}
P = SupervisorPolicy(stale_after_s=60, runner_stale_after_s=60, stall_after_s=120)


def test_healthy() -> None:
    assert decide(ControlView([job()], RUNNER), NOW, P).action == "ok"


def test_watermark_change_restarts() -> None:
    d = decide(ControlView([job(restart_required=True, restart_reasons=["rules need watermark delay 30s"])], RUNNER),
               NOW, P)
    assert d.action == "restart" and "30s" in d.reasons[0]


def test_a_pending_request_waits_instead_of_asking_twice() -> None:
    req = {"request_id": "r1", "requested_at": iso(20)}
    view = ControlView([job(restart_required=True)], RUNNER, last_request=req)
    assert decide(view, NOW, P).action == "wait"
    answered = ControlView([job(restart_required=True)], RUNNER, last_request=req,
                           restarts=[{"event": "restarted", "request_id": "r1"}])
    assert decide(answered, NOW, P).action == "restart"


def test_crash_loop_fails_with_the_runners_reason() -> None:
    runner = {**RUNNER, "state": "gave_up", "reason": "crash loop: driver exited with 1"}
    d = decide(ControlView([job(state="failed")], runner), NOW, P)
    assert d.action == "fail" and "crash loop: driver exited with 1" in d.reasons[0]


def test_no_runner_or_a_silent_one_alerts() -> None:
    assert decide(ControlView([job()], None), NOW, P).action == "alert"
    assert decide(ControlView([job()], {**RUNNER, "updated_at": iso(300)}), NOW, P).action == "alert"


def test_a_failed_job_is_the_runners_to_restart() -> None:
    assert decide(ControlView([job(state="failed")], RUNNER), NOW, P).action == "ok"


def test_hung_job_restarts() -> None:
    assert decide(ControlView([job(updated_at=iso(300))], RUNNER), NOW, P).action == "restart"


def test_stalled_with_growing_lag_restarts_but_slow_is_only_lag() -> None:
    history = [job(updated_at=iso(100), last_batch_time=iso(200), lag=50),
               job(updated_at=iso(1), last_batch_time=iso(200), lag=900)]
    d = decide(ControlView(history, RUNNER), NOW, P)
    assert d.action == "restart" and "stalled" in d.reasons[0]
    steady = [job(updated_at=iso(100), last_batch_time=iso(200), lag=900),
              job(updated_at=iso(1), last_batch_time=iso(200), lag=900)]
    assert decide(ControlView(steady, RUNNER), NOW, P).action == "ok"
    slow = [job(updated_at=iso(1), last_batch_time=iso(3), lag=10_000)]
    assert decide(ControlView(slow, RUNNER), NOW, SupervisorPolicy(max_lag=1000)).action == "alert"


def test_a_stalled_real_time_lane_restarts_the_job_though_its_micro_batches_run() -> None:
    def lane(batch_ago: float, lag: int) -> dict:
        return {"mode": "real-time", "last_batch_time": iso(batch_ago), "lag": lag}

    history = [job(updated_at=iso(100), threshold_lane=lane(200, 50)),
               job(updated_at=iso(1), threshold_lane=lane(200, 900))]
    d = decide(ControlView(history, RUNNER), NOW, P)
    assert d.action == "restart" and d.reasons == [
        "stalled: the real-time lane ran no batch for 200s (> 120s) while the lag grew from 50 to 900"]
    running = [job(updated_at=iso(100), threshold_lane=lane(2, 50)),
               job(updated_at=iso(1), threshold_lane=lane(1, 900))]
    assert decide(ControlView(running, RUNNER), NOW, P).action == "ok"


class _Msg:
    def __init__(self, value: bytes) -> None:
        self._v = value

    def value(self) -> bytes:
        return self._v


def test_request_and_answer_records() -> None:
    [(key, value)] = restart_request_records("dag/run1", "rules need 30s", "airflow:dag/run1")
    req = json.loads(value)
    assert key == b"detection-job" and req["action"] == "restart" and req["requested_by"] == "airflow:dag/run1"
    answer = {"event": "restarted", "request_id": "dag/run1", "by": "airflow:dag/run1"}
    assert match_restart_record(_Msg(json.dumps(answer).encode()), "dag/run1") == answer
    assert match_restart_record(_Msg(json.dumps(answer).encode()), "dag/run2") is None
    assert match_restart_record(_Msg(b"not json"), "dag/run1") is None


def test_a_driver_that_is_still_starting_is_waited_for_then_alerted() -> None:
    """The first supervisor run after a start finds no status yet: a start, not a failure."""
    starting = {**RUNNER, "driver_started_at": iso(40)}
    d = decide(ControlView([], starting), NOW, P)
    assert d.action == "wait" and "starting" in d.reasons[0]
    # The status of the driver that ran before the platform was stopped says nothing of this one.
    stale_earlier = job(state="running", updated_at=iso(900), last_batch_time=iso(900))
    assert decide(ControlView([stale_earlier], starting), NOW, P).action == "wait"
    # Past the grace, silence is an alert that says how long it has been.
    silent = {**RUNNER, "driver_started_at": iso(P.start_grace_s + 60)}
    d = decide(ControlView([], silent), NOW, P)
    assert d.action == "alert" and f"{P.start_grace_s + 60:.0f}s after its driver started" in d.reasons[0]
    # Without a start time (an older runner) nothing changes: no status is an alert.
    assert decide(ControlView([], RUNNER), NOW, P).action == "alert"
