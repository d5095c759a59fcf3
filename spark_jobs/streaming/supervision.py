"""What the detection supervisor (dags/detection_supervisor.py, plugins/rule_lifecycle/
supervision.py, spark_jobs.platform.control) takes from the job's side: its settings
(`SupervisorSettings`), `parse_time` and `summary` of a status snapshot.

Settings: the Airflow Variable `detection_supervisor` (a JSON object), environment
variables `DETECTION_SUPERVISOR_<NAME>`, then defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

from spark_jobs import layered_settings

VARIABLE_NAME = "detection_supervisor"
ENV_PREFIX = "DETECTION_SUPERVISOR_"


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


@dataclass
class SupervisorSettings:
    """Knobs of the supervisor; see the module docstring for where values come from."""

    # The job refreshes its status every ~0.5 s; this long without an update = dead or hung.
    stale_after_s: float = 60.0
    # Alert (no restart) above this many unread records; None: no lag alert.
    max_lag: int | None = None
    # False: say what would be done, never ask for a restart.
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
