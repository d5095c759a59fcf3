"""Supervision of the detection job: a hook on its status file and restart, two operators.

The logic is spark_jobs.streaming.supervision; these are its Airflow faces, used by
dags/detection_supervisor.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from airflow.providers.common.compat.sdk import BaseHook, BaseOperator

from spark_jobs.streaming import supervision


class DetectionJobHook(BaseHook):
    """The running detection job: its status (`status.json`) and a graceful restart.

    :param status_file: the job's status file (default: setting `status_file`, i.e.
        RULES_DETECT_STATUS_FILE or `$RULES_DETECT_CHECKPOINT/status.json`).
    :param platform_state: `platform.json` of `rulectl up` (default: RULES_PLATFORM_STATE).
    """

    hook_name = "Detection job (rule platform)"

    def __init__(self, status_file: str | None = None, platform_state: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not status_file or not platform_state:
            s = supervision.resolve_supervisor_settings(use_airflow=False)
            status_file = status_file or s.status_file
            platform_state = platform_state or s.platform_state
        self.status_file = status_file
        self.platform_state = platform_state

    def get_status(self) -> dict | None:
        """The latest status snapshot, or None when the job wrote none (yet)."""
        if not self.status_file:
            raise ValueError(
                "No status file: set `status_file` in the detection_supervisor Variable or RULES_DETECT_STATUS_FILE"
            )
        return supervision.read_status(Path(self.status_file))

    def assess(self, stale_after_s: float, max_lag: int | None, now: datetime | None = None) -> tuple[dict | None, Any]:
        status = self.get_status()
        return status, supervision.assess(status, now or datetime.now(UTC), stale_after_s, max_lag)

    def request_restart(self) -> int:
        """SIGTERM the job's pid; `rulectl up` restarts it from its checkpoint."""
        if not self.platform_state:
            raise ValueError(
                "No platform state: set `platform_state` in the detection_supervisor Variable or RULES_PLATFORM_STATE"
            )
        return supervision.request_restart(Path(self.platform_state))


class DetectionHealthOperator(BaseOperator):
    """Read the job's status and decide: ok, restart or alert. Says what it found in the log.

    :param settings_overrides: overrides of the detection_supervisor settings (templated
        dict); default: the run's `settings` param.
    :return: {"action", "reasons", "summary", "status", "settings"} (pushed to XCom).
    """

    template_fields: Sequence[str] = ("settings_overrides",)
    ui_color = "#e0ecfd"

    def __init__(self, *, settings_overrides: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings_overrides = settings_overrides

    def execute(self, context: Any) -> dict:
        overrides = self.settings_overrides
        if overrides is None:
            overrides = (context.get("params") or {}).get("settings")
        overrides = overrides if isinstance(overrides, dict) else {}
        s = supervision.resolve_supervisor_settings(overrides)
        hook = DetectionJobHook(s.status_file, s.platform_state)
        status, verdict = hook.assess(s.stale_after_s, s.max_lag)
        self.log.info("Detection job (%s): %s", hook.status_file, supervision.summary(status))
        if verdict.action == "ok":
            self.log.info("Healthy: no restart needed.")
        else:
            for reason in verdict.reasons:
                self.log.warning("%s: %s", verdict.action.upper(), reason)
        return {
            "action": verdict.action,
            "reasons": verdict.reasons,
            "summary": supervision.summary(status),
            "status": status,
            "settings": s.to_dict(),
        }


class RestartDetectionJobOperator(BaseOperator):
    """Gracefully restart the detection job (SIGTERM; `rulectl up` starts it again).

    :param health: the DetectionHealthOperator's result (templated / XComArg).
    """

    template_fields: Sequence[str] = ("health",)
    ui_color = "#fde0e0"

    def __init__(self, *, health: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.health = health

    def execute(self, context: Any) -> int | None:
        health = dict(self.health)
        s = health["settings"]
        for reason in health["reasons"]:
            self.log.warning("Restart because: %s", reason)
        if not s.get("restart_enabled", True):
            self.log.warning("restart_enabled is false: not signalling the job.")
            return None
        pid = DetectionJobHook(s["status_file"], s["platform_state"]).request_restart()
        self.log.info("Sent SIGTERM to the detection job (pid %s); `rulectl up` restarts it from its checkpoint.", pid)
        return pid
