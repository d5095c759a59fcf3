"""detection_supervisor: keep the detection job healthy from anywhere, restart it only when needed.

Airflow shares no host, file or process with the Spark driver. Every
DETECTION_SUPERVISOR_SCHEDULE (default every minute):

- `check_health` reads `detect.status` (the job's status and its runner's) through the
  Kafka provider's hook, logs the restart history, and decides
  (spark_jobs.platform.control.decide);
- `restart`: the rules need another watermark delay (or new topics), or the job is hung
  or stalled with a growing lag: `request_restart` writes one request to
  `detect.control` (ProduceToTopicOperator), `await_restart` defers until the runner on
  the driver host answers on `detect.restarts` (AwaitMessageSensor), `confirm_restart`
  waits for the new job's status;
- `fail`: the runner gave up (crash loop): the run fails with its reason, no restart;
- `alert`: no runner, or lag above the limit: the run fails, no restart;
- `healthy`: nothing to do (also while a restart asked earlier is still in progress).

Connections: `detect_kafka` (reads; its extra holds bootstrap.servers, group.id) and
`detect_kafka_producer` (the request; acks=all, idempotence). Settings: Airflow Variable
`detection_supervisor` / env DETECTION_SUPERVISOR_* (spark_jobs.streaming.supervision).
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta

from airflow.providers.apache.kafka.operators.produce import ProduceToTopicOperator
from airflow.providers.apache.kafka.sensors.kafka import AwaitMessageSensor
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Param, task
from airflow.sdk.exceptions import AirflowFailException
from rule_lifecycle.defaults import TASK_DEFAULTS
from rule_lifecycle.supervision import ConfirmRestartOperator, DetectionHealthOperator

ENV = "DETECTION_SUPERVISOR_"
CONSUMER_CONN = os.environ.get(f"{ENV}KAFKA_CONN_ID", "detect_kafka")
PRODUCER_CONN = os.environ.get(f"{ENV}KAFKA_PRODUCER_CONN_ID", "detect_kafka_producer")
CONTROL_TOPIC = os.environ.get(f"{ENV}CONTROL_TOPIC", "detect.control")
RESTARTS_TOPIC = os.environ.get(f"{ENV}RESTARTS_TOPIC", "detect.restarts")
RESTART_TIMEOUT_S = float(os.environ.get(f"{ENV}RESTART_TIMEOUT_S", "600"))

with DAG(
    dag_id="detection_supervisor",
    description="Health of the detection job from its status topic; restart on watermark change, hang or stall",
    schedule=os.environ.get("DETECTION_SUPERVISOR_SCHEDULE", "* * * * *"),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    dagrun_timeout=timedelta(minutes=20),
    tags=["rules", "detection"],
    default_args=TASK_DEFAULTS,
    params={"settings": Param({}, type="object", description="Overrides of the detection_supervisor settings")},
    doc_md=__doc__,
) as dag:
    check = DetectionHealthOperator(task_id="check_health", execution_timeout=timedelta(minutes=2))

    @task.branch
    def decide(health: dict) -> str:
        """request_restart | fail | alert | healthy, from the health verdict."""
        return {"restart": "request_restart", "fail": "fail", "alert": "alert"}.get(health["action"], "healthy")

    @task
    def fail(health: dict) -> None:
        """The runner gave up (crash loop): fail loudly with its reason; a restart would not help."""
        raise AirflowFailException("; ".join(health["reasons"]))

    @task
    def alert(health: dict) -> None:
        """Someone should look (no runner, lag); restarting would not help."""
        raise AirflowFailException("; ".join(health["reasons"]) + f" ({health['summary']})")

    request = ProduceToTopicOperator(
        task_id="request_restart",
        kafka_config_id=PRODUCER_CONN,
        topic=CONTROL_TOPIC,
        producer_function="spark_jobs.platform.control.restart_request_records",
        producer_function_kwargs={
            "request_id": "{{ dag.dag_id }}/{{ run_id }}",
            "reason": "{{ ti.xcom_pull(task_ids='check_health')['reasons'] | join('; ') }}",
            "requested_by": "airflow:{{ dag.dag_id }}/{{ run_id }}",
        },
        execution_timeout=timedelta(minutes=1),
        retries=0,  # a second request for one need could restart the job twice
    )
    answer = AwaitMessageSensor(
        task_id="await_restart",
        kafka_config_id=CONSUMER_CONN,
        topics=[RESTARTS_TOPIC],
        apply_function="spark_jobs.platform.control.match_restart_record",
        apply_function_kwargs={"request_id": "{{ dag.dag_id }}/{{ run_id }}"},
        poll_interval=0.2,
        timeout=RESTART_TIMEOUT_S,
    )
    confirm = ConfirmRestartOperator(task_id="confirm_restart", answer=answer.output,
                                     execution_timeout=timedelta(minutes=10))

    decide(check.output) >> [request, fail(check.output), alert(check.output), EmptyOperator(task_id="healthy")]
    request >> answer >> confirm
