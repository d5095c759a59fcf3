"""Supervision of the detection job on one host: is it healthy, does it need a restart?

The `detection_supervisor` DAG no longer uses the file and pid parts of this module: it
supervises across hosts through Kafka (spark_jobs.platform.control, `rulectl runner`)
and takes only `SupervisorSettings`, `parse_time` and `summary` from here. `assess` and
`request_restart` remain for a supervisor that shares the job's host:

* `assess(status, now, ...)` judges one status snapshot (`<checkpoint>/status.json`,
  written by spark_jobs.streaming.job every ~0.5 s). A restart is the answer only when it
  is needed: the rules in force need another watermark delay than the job started with
  (`restart_required`), the job stopped or failed, or its status stopped being refreshed
  (dead or hung). A lag above the limit is an alert, never a restart: restarting does
  not make a slow job faster.
* `request_restart(platform_state)` sends SIGTERM to `components.detect.pid` of the
  `platform.json` that `rulectl up` writes; the job finishes its batch, commits and exits
  0, and `up` starts it again from its checkpoint (no event lost).

Settings (`SupervisorSettings`): the Airflow Variable `detection_supervisor` (a JSON
object), environment variables `DETECTION_SUPERVISOR_<NAME>`, then defaults; the paths
default to RULES_DETECT_STATUS_FILE / RULES_PLATFORM_STATE, which `rulectl up` gives the
Airflow processes it starts.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from spark_jobs import layered_settings

Action = Literal["ok", "restart", "alert"]

VARIABLE_NAME = "detection_supervisor"
ENV_PREFIX = "DETECTION_SUPERVISOR_"


@dataclass(frozen=True)
class Verdict:
    action: Action
    reasons: list[str] = field(default_factory=list)


def parse_time(value: object) -> datetime | None:
    """ISO-8601 text (offset, `Z` or none = UTC) or epoch seconds -> aware datetime."""
    if value is None or value == "":
        return None
    if isinstance(value, int | float):
        return datetime.fromtimestamp(float(value), UTC)
    try:
        dt = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def assess(status: Mapping | None, now: datetime, stale_after_s: float, max_lag: int | None) -> Verdict:
    """Restart when needed (watermark change, stopped/failed, stale); alert on lag; else ok."""
    if not status:
        return Verdict("alert", ["no status from the detection job (not started yet, or wrong status file)"])
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    restart: list[str] = []
    state = status.get("state")
    if state in ("failed", "stopped"):
        restart.append(f"job state is {state!r}")
    if status.get("restart_required"):
        restart.extend(status.get("restart_reasons") or [
            f"rules need watermark delay {status.get('rules_watermark_delay_s')}s, "
            f"job started with {status.get('watermark_delay_s')}s"
        ])
    updated = parse_time(status.get("updated_at"))
    if updated is None:
        restart.append(f"status has no valid updated_at ({status.get('updated_at')!r})")
    else:
        age = (now - updated).total_seconds()
        if age > stale_after_s:
            restart.append(f"status not updated for {age:.0f}s (> {stale_after_s:g}s): job dead or hung")
    if restart:
        return Verdict("restart", restart)
    lag = status.get("lag")
    if max_lag is not None and lag is not None and lag > max_lag:
        return Verdict("alert", [f"lag {lag} records > max_lag {max_lag}"])
    return Verdict("ok", [])


def summary(status: Mapping | None) -> str:
    """One line for the log: watermark delays, lag, last batch."""
    if not status:
        return "no status"
    return (
        f"state {status.get('state')}, run {status.get('run_id')}, started {status.get('started_at')}, "
        f"updated {status.get('updated_at')}; watermark delay started with {status.get('watermark_delay_s')}s, "
        f"rules need {status.get('rules_watermark_delay_s')}s; lag {status.get('lag')}; "
        f"last batch {status.get('last_batch_id')} at {status.get('last_batch_time')} "
        f"({status.get('num_input_rows')} rows, {status.get('processed_rows_per_second')} rows/s processed); "
        f"watermark {status.get('watermark')}"
    )


def read_status(path: Path) -> dict | None:
    """The status file, or None when it does not exist (yet)."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None


# ------------------------------------------------------------------------------ restart


class RestartError(RuntimeError):
    """The restart could not be requested (no platform state, no pid, process gone)."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    try:  # a zombie has exited: nothing would act on the signal
        return stat.read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _cmdline(pid: int) -> list[str] | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a] or None


def detect_pid(platform_state: Path) -> int:
    """The detection job's pid from platform.json, checked to be that live process."""
    path = Path(platform_state)
    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        raise RestartError(f"platform state {path} does not exist: is `rulectl up` running?") from None
    except json.JSONDecodeError as exc:
        raise RestartError(f"platform state {path} is not valid JSON: {exc}") from None
    detect = (state.get("components") or {}).get("detect")
    if not isinstance(detect, dict):
        raise RestartError(f"{path} has no components.detect: `rulectl up` does not run the detection job")
    pid = detect.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        raise RestartError(f"{path} has no pid for components.detect (got {pid!r}): the job is not running")
    if not _alive(pid):
        raise RestartError(f"detection job process {pid} (from {path}) is gone")
    argv, actual = detect.get("argv"), _cmdline(pid)
    if argv and actual is not None and list(argv) != actual:
        raise RestartError(f"process {pid} is not the detection job ({' '.join(actual)!r}): stale {path}?")
    return pid


def request_restart(platform_state: Path) -> int:
    """SIGTERM the detection job (graceful stop; `rulectl up` restarts it). Returns the pid."""
    pid = detect_pid(platform_state)
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        raise RestartError(f"detection job process {pid} exited before it could be signalled") from None
    return pid


# ------------------------------------------------------------------------------ settings


def _env_path(*names: str) -> str:
    for n in names:
        if os.environ.get(n):
            return os.environ[n]
    return ""


def _default_status_file() -> str:
    if os.environ.get("RULES_DETECT_STATUS_FILE"):
        return os.environ["RULES_DETECT_STATUS_FILE"]
    checkpoint = os.environ.get("RULES_DETECT_CHECKPOINT")
    return str(Path(checkpoint) / "status.json") if checkpoint else ""


@dataclass
class SupervisorSettings:
    """Knobs of the supervisor; see module docstring for where values come from."""

    status_file: str = field(default_factory=_default_status_file)
    platform_state: str = field(default_factory=lambda: _env_path("RULES_PLATFORM_STATE"))
    # The job refreshes its status every ~0.5 s; this long without an update = dead or hung.
    stale_after_s: float = 60.0
    # Alert (no restart) above this many unread records; None: no lag alert.
    max_lag: int | None = None
    # False: say what would be done, never signal the job.
    restart_enabled: bool = True
    # Supervision across hosts (dags/detection_supervisor.py, spark_jobs.platform.control):
    # Airflow connections (Kafka provider) for reading the topics and for writing requests.
    kafka_conn_id: str = "detect_kafka"
    kafka_producer_conn_id: str = "detect_kafka_producer"
    status_topic: str = "detect.status"
    control_topic: str = "detect.control"
    restarts_topic: str = "detect.restarts"
    runner_stale_after_s: float = 60.0
    # No batch for this long while the lag grows: stalled, restart.
    stall_after_s: float = 120.0
    # An unanswered restart request older than this may be asked again.
    request_timeout_s: float = 600.0
    # How long the run waits for the restarted job to report running.
    restart_wait_s: float = 300.0
    # No status yet this long after the runner started the driver: a start, not a failure.
    start_grace_s: float = 300.0

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping) -> SupervisorSettings:
        return layered_settings.from_dict(cls, data, VARIABLE_NAME)


def resolve_supervisor_settings(overrides: Mapping | None = None, *, use_airflow: bool = True) -> SupervisorSettings:
    """Defaults < env DETECTION_SUPERVISOR_* < Airflow Variable `detection_supervisor` < overrides."""
    return layered_settings.resolve(SupervisorSettings, VARIABLE_NAME, ENV_PREFIX, overrides, use_airflow)
