"""Supervision of the detection job across hosts: a hook over its Kafka topics, two operators.

Airflow never shares a host, a file or a process namespace with the Spark driver: the
job's health is read from `detect.status` (the job's and its runner's records), restarts
are asked for on `detect.control` and answered on `detect.restarts` by `rulectl runner`
on the driver host. The reads go through the Kafka provider's KafkaConsumerHook (its
connection carries the cluster's address and security settings); the request and the
wait for its answer are the provider's ProduceToTopicOperator and AwaitMessageSensor in
dags/detection_supervisor.py. The verdict is spark_jobs.platform.control.decide.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from airflow.providers.apache.kafka.hooks.consume import KafkaConsumerHook
from airflow.providers.common.compat.sdk import BaseOperator

from spark_jobs.kafka.admin import read_all_with
from spark_jobs.platform import control
from spark_jobs.streaming import supervision

STATUS_TAIL = 5000


class DetectionControlHook(KafkaConsumerHook):
    """The detection job's control topics, read through a Kafka provider connection.

    Reads assign partitions and never commit (the connection's group is the one the
    AwaitMessageSensor commits with).
    """

    hook_name = "Detection job control topics (rule platform)"

    def __init__(self, kafka_config_id: str = "detect_kafka", status_topic: str = control.STATUS_TOPIC,
                 control_topic: str = control.CONTROL_TOPIC, restarts_topic: str = control.RESTARTS_TOPIC) -> None:
        super().__init__(topics=[status_topic], kafka_config_id=kafka_config_id)
        self.status_topic, self.control_topic, self.restarts_topic = status_topic, control_topic, restarts_topic

    def _records(self, topic: str, last: int | None = None) -> list:
        consumer = self.get_conn
        try:
            return read_all_with(consumer, topic, timeout=30, last=last)
        finally:
            consumer.unassign()

    def view(self, history_s: float = 600.0) -> control.ControlView:
        """The job's recent status records, the runner's status, the newest request and
        the restart records, as of now."""
        # The job writes its status twice a second, the runner every 2 s: the tail holds
        # the newest of both and the recent history (the topic's start may be days old).
        status = self._records(self.status_topic, last=STATUS_TAIL)
        cutoff = (time.time() - history_s) * 1000
        job = [control.parse_record(r.value) for r in status
               if r.key == control.JOB_KEY.encode() and r.timestamp_ms >= cutoff]
        latest = control.latest_by_key((r.key, r.value) for r in status)
        requests = control.latest_by_key((r.key, r.value) for r in self._records(self.control_topic))
        restarts = [control.parse_record(r.value) for r in self._records(self.restarts_topic)]
        job_history = [j for j in job if j] or ([latest[control.JOB_KEY]] if control.JOB_KEY in latest else [])
        return control.ControlView(job_history=job_history, runner=latest.get(control.RUNNER_KEY),
                                   last_request=requests.get(control.JOB_KEY), restarts=[r for r in restarts if r])


def _settings(context: Any, overrides: Any) -> supervision.SupervisorSettings:
    if overrides is None:
        overrides = (context.get("params") or {}).get("settings")
    return supervision.resolve_supervisor_settings(overrides if isinstance(overrides, dict) else {})


def _hook(s: supervision.SupervisorSettings) -> DetectionControlHook:
    return DetectionControlHook(s.kafka_conn_id, s.status_topic, s.control_topic, s.restarts_topic)


def _policy(s: supervision.SupervisorSettings) -> control.SupervisorPolicy:
    return control.SupervisorPolicy(stale_after_s=s.stale_after_s, runner_stale_after_s=s.runner_stale_after_s,
                                    stall_after_s=s.stall_after_s, max_lag=s.max_lag,
                                    request_timeout_s=s.request_timeout_s, start_grace_s=s.start_grace_s)


class DetectionHealthOperator(BaseOperator):
    """Read the job's health from the status topic and decide: ok, wait, restart, alert, fail.

    Logs what it found and the restart history (who, why, when) so both are in the task log.

    :param settings_overrides: overrides of the detection_supervisor settings (templated
        dict); default: the run's `settings` param.
    :return: {"action", "reasons", "summary", "status", "runner", "restarts", "settings"}.
    """

    template_fields: Sequence[str] = ("settings_overrides",)
    ui_color = "#e0ecfd"

    def __init__(self, *, settings_overrides: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings_overrides = settings_overrides

    def execute(self, context: Any) -> dict:
        s = _settings(context, self.settings_overrides)
        view = _hook(s).view()
        decision = control.decide(view, datetime.now(UTC), _policy(s))
        if not s.restart_enabled and decision.action == "restart":
            decision = control.Decision("alert", [*decision.reasons, "restart_enabled is false: not asking"])
        self.log.info("Detection job: %s", supervision.summary(view.job))
        self.log.info("Runner: %s", dict(view.runner) if view.runner else None)
        for r in list(view.restarts)[-10:]:
            self.log.info("Restart history: %s %s by %s: %s", r.get("at"), r.get("event"), r.get("by"), r.get("reason"))
        for reason in decision.reasons:
            self.log.warning("%s: %s", decision.action.upper(), reason)
        return {
            "action": decision.action,
            "reasons": decision.reasons,
            "summary": supervision.summary(view.job),
            "status": dict(view.job) if view.job else None,
            "runner": dict(view.runner) if view.runner else None,
            "restarts": [dict(r) for r in list(view.restarts)[-10:]],
            "settings": s.to_dict(),
        }


class ConfirmRestartOperator(BaseOperator):
    """After the runner answered a restart request: fail if it could not restart, else wait
    until the new job reports running and log its watermark delay.

    :param answer: the runner's restart record (the AwaitMessageSensor's event; templated).
    """

    template_fields: Sequence[str] = ("answer", "settings_overrides")
    ui_color = "#fde0e0"

    def __init__(self, *, answer: Any, settings_overrides: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.answer = answer
        self.settings_overrides = settings_overrides

    def execute(self, context: Any) -> dict:
        from airflow.sdk.exceptions import AirflowFailException

        answer = dict(self.answer or {})
        self.log.info("Runner answered: %s", answer)
        if answer.get("event") != "restarted":
            raise AirflowFailException(f"the runner did not restart the job: {answer.get('reason')}")
        s = _settings(context, self.settings_overrides)
        hook = _hook(s)
        since = supervision.parse_time(answer.get("at"))
        deadline = time.monotonic() + s.restart_wait_s
        while time.monotonic() < deadline:
            job = hook.view(history_s=60).job
            started = supervision.parse_time((job or {}).get("started_at"))
            if job and job.get("state") == "running" and started and since and started >= since.replace(microsecond=0):
                self.log.info("Restarted job running: %s", supervision.summary(job))
                return {"restart": answer, "status": dict(job)}
            time.sleep(2)
        raise AirflowFailException(f"the job did not report running within {s.restart_wait_s:g}s after the restart")
