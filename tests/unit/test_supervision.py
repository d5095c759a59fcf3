"""Detection job supervision: assess() verdicts, request_restart() on a real process, DAG import."""

from __future__ import annotations

import json
import signal
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from dag_import import import_dag

from spark_jobs.streaming.supervision import (
    RestartError,
    SupervisorSettings,
    assess,
    request_restart,
    resolve_supervisor_settings,
    summary,
)

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 3, 1, 12, 0, 0, tzinfo=UTC)


def status(**over) -> dict:
    base = {
        "state": "running",
        "query_id": "q",
        "run_id": "r",
        "started_at": "2026-03-01T11:00:00+00:00",
        "updated_at": (NOW - timedelta(seconds=1)).isoformat(),
        "watermark_delay_s": 5.0,
        "rules_watermark_delay_s": 5.0,
        "restart_required": False,
        "last_batch_id": 41,
        "last_batch_time": "2026-03-01T11:59:59.000Z",
        "lag": 10,
        "watermark": "2026-03-01T11:59:50.000Z",
    }
    return {**base, **over}


# ------------------------------------------------------------------------------ assess


def test_healthy_is_ok() -> None:
    v = assess(status(), NOW, stale_after_s=60, max_lag=100)
    assert (v.action, v.reasons) == ("ok", [])


def test_no_lag_limit_is_ok_whatever_the_lag() -> None:
    assert assess(status(lag=10**9), NOW, 60, None).action == "ok"
    assert assess(status(lag=None), NOW, 60, 5).action == "ok"


def test_watermark_change_restarts() -> None:
    v = assess(status(rules_watermark_delay_s=30.0, restart_required=True), NOW, 60, None)
    assert v.action == "restart"
    assert v.reasons == ["rules need watermark delay 30.0s, job started with 5.0s"]


@pytest.mark.parametrize("state", ["failed", "stopped"])
def test_dead_job_restarts(state: str) -> None:
    v = assess(status(state=state), NOW, 60, None)
    assert v.action == "restart" and f"job state is '{state}'" in v.reasons


def test_stale_status_restarts() -> None:
    old = (NOW - timedelta(seconds=90)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    v = assess(status(updated_at=old), NOW, 60, None)
    assert v.action == "restart" and "90s" in v.reasons[0] and "hung" in v.reasons[0]
    assert assess(status(updated_at=old), NOW, 120, None).action == "ok"


def test_missing_updated_at_restarts() -> None:
    assert assess(status(updated_at=None), NOW, 60, None).action == "restart"


def test_restart_wins_over_lag_and_lists_every_reason() -> None:
    old = (NOW - timedelta(minutes=5)).isoformat()
    v = assess(status(state="failed", restart_required=True, updated_at=old, lag=10**6), NOW, 60, 100)
    assert v.action == "restart" and len(v.reasons) == 3


def test_lag_alerts_without_restart() -> None:
    v = assess(status(lag=5000), NOW, 60, 1000)
    assert (v.action, v.reasons) == ("alert", ["lag 5000 records > max_lag 1000"])


def test_no_status_alerts() -> None:
    assert assess(None, NOW, 60, None).action == "alert"


def test_summary_says_delays_lag_and_batch() -> None:
    line = summary(status(rules_watermark_delay_s=30.0))
    assert "started with 5.0s" in line and "rules need 30.0s" in line and "lag 10" in line and "last batch 41" in line


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RULES_DETECT_CHECKPOINT", str(tmp_path / "cp"))
    monkeypatch.delenv("RULES_DETECT_STATUS_FILE", raising=False)
    monkeypatch.setenv("RULES_PLATFORM_STATE", str(tmp_path / "platform.json"))
    monkeypatch.setenv("DETECTION_SUPERVISOR_MAX_LAG", "500")
    monkeypatch.setenv("DETECTION_SUPERVISOR_STALE_AFTER_S", "15")
    s = resolve_supervisor_settings(use_airflow=False)
    assert s == SupervisorSettings(str(tmp_path / "cp" / "status.json"), str(tmp_path / "platform.json"), 15.0, 500)
    with pytest.raises(ValueError, match="unknown"):
        resolve_supervisor_settings({"nope": 1}, use_airflow=False)


# ------------------------------------------------------------------------------ request_restart


def platform_json(path: Path, pid: int | None, argv: list[str] | None = None) -> Path:
    path.write_text(json.dumps({"components": {"detect": {"pid": pid, "argv": argv, "running": pid is not None}}}))
    return path


@pytest.fixture
def child():
    proc = subprocess.Popen(["sleep", "30"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait(5)


def test_request_restart_sends_sigterm(child: subprocess.Popen, tmp_path: Path) -> None:
    state = platform_json(tmp_path / "platform.json", child.pid, ["sleep", "30"])
    assert request_restart(state) == child.pid
    assert child.wait(5) == -signal.SIGTERM


def test_request_restart_errors(child: subprocess.Popen, tmp_path: Path) -> None:
    with pytest.raises(RestartError, match="does not exist"):
        request_restart(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(RestartError, match="not valid JSON"):
        request_restart(tmp_path / "bad.json")
    (tmp_path / "nodetect.json").write_text(json.dumps({"components": {}}))
    with pytest.raises(RestartError, match="no components.detect"):
        request_restart(tmp_path / "nodetect.json")
    with pytest.raises(RestartError, match="no pid"):
        request_restart(platform_json(tmp_path / "nopid.json", None))
    if Path(f"/proc/{child.pid}/cmdline").exists():  # a reused pid is not signalled
        with pytest.raises(RestartError, match="not the detection job"):
            request_restart(platform_json(tmp_path / "other.json", child.pid, ["python", "-m", "spark_jobs.cli", "detect"]))
        assert child.poll() is None
    child.kill()
    child.wait(5)
    with pytest.raises(RestartError, match="is gone"):
        request_restart(platform_json(tmp_path / "gone.json", child.pid))


# ------------------------------------------------------------------------------ DAG import


def test_dag_imports_without_errors(tmp_path: Path) -> None:
    out = import_dag(tmp_path, "detection_supervisor", "'max_active_runs': d and d.max_active_runs, "
                     "'catchup': d and d.catchup", drop_env=("DETECTION_SUPERVISOR_",), timeout=60)
    assert out["errors"] == {}
    assert out["tasks"] == {
        "check_health": ["alert", "decide", "fail"],  # XCom inputs; `decide` picks one
        "decide": ["alert", "fail", "healthy", "request_restart"],
        "request_restart": ["await_restart"],  # the Kafka provider's operator and sensor
        "await_restart": ["confirm_restart"],
        "confirm_restart": [],
        "fail": [],
        "alert": [],
        "healthy": [],
    }
    assert out["max_active_runs"] == 1 and out["catchup"] is False
