"""Detection job supervision: the status summary, the settings, the DAG import."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from dag_import import import_dag

from spark_jobs.streaming.supervision import SupervisorSettings, resolve_supervisor_settings, summary

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


def test_summary_says_delays_lag_and_batch() -> None:
    line = summary(status(rules_watermark_delay_s=30.0))
    assert "started with 5.0s" in line and "rules need 30.0s" in line and "lag 10" in line and "last batch 41" in line


def test_settings_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DETECTION_SUPERVISOR_MAX_LAG", "500")
    monkeypatch.setenv("DETECTION_SUPERVISOR_STALE_AFTER_S", "15")
    s = resolve_supervisor_settings(use_airflow=False)
    assert s == SupervisorSettings(stale_after_s=15.0, max_lag=500)
    with pytest.raises(ValueError, match="unknown"):
        resolve_supervisor_settings({"nope": 1}, use_airflow=False)


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
