"""detection_supervisor: keep the continuous detection job healthy, restart it only when needed.

Every DETECTION_SUPERVISOR_SCHEDULE (default every minute) `check_health` reads the job's
status file and logs what it found (watermark delay the job started with vs what the
rules need, lag, last batch). `decide` then picks one path:

- `restart_job`: the rules need another watermark delay, or the job stopped, failed or
  stopped refreshing its status. SIGTERM to the job's pid (platform.json of `rulectl
  up`): it finishes its batch and `up` restarts it from its checkpoint. Reasons are logged.
- `alert`: lag above `max_lag` or no status at all; fails the run (visible, notifiable),
  never restarts.
- `healthy`: nothing to do.

Settings: Airflow Variable `detection_supervisor` / env DETECTION_SUPERVISOR_* (see
spark_jobs.streaming.supervision); the logic lives there and in plugins/.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Param, task
from airflow.sdk.exceptions import AirflowFailException
from rule_lifecycle.supervision import DetectionHealthOperator, RestartDetectionJobOperator

with DAG(
    dag_id="detection_supervisor",
    description="Health of the detection job; restart on watermark change, death or stall",
    schedule=os.environ.get("DETECTION_SUPERVISOR_SCHEDULE", "* * * * *"),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(minutes=5),
    tags=["rules", "detection"],
    params={"settings": Param({}, type="object", description="Overrides of the detection_supervisor settings")},
    doc_md=__doc__,
) as dag:
    check = DetectionHealthOperator(task_id="check_health", execution_timeout=timedelta(minutes=1))

    @task.branch
    def decide(health: dict) -> str:
        """restart_job | alert | healthy, from the health verdict."""
        return {"restart": "restart_job", "alert": "alert"}.get(health["action"], "healthy")

    @task
    def alert(health: dict) -> None:
        """Fail the run with the reasons: someone should look; a restart would not help."""
        raise AirflowFailException("; ".join(health["reasons"]) + f" ({health['summary']})")

    restart = RestartDetectionJobOperator(task_id="restart_job", health=check.output, execution_timeout=timedelta(minutes=1))
    decide(check.output) >> [restart, alert(check.output), EmptyOperator(task_id="healthy")]
