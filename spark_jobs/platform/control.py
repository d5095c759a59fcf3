"""The detection job's control plane over Kafka: health, restart requests, restart records.

Airflow and the Spark driver need not share a host, a user, a process namespace or a
file system, so everything between them goes through three topics:

* `detect.status` (compacted): key `detection-job` is the job's own status (written by
  the job every ~0.5 s), key `runner` the status of the runner on the driver host
  (`rulectl runner`: running / backing off / gave up, and why).
* `detect.control` (compacted): restart requests, key `detection-job`, value
  `{"request_id", "action": "restart", "reason", "requested_by", "requested_at"}`.
  The runner obeys the requests written after it started (a request older than the
  runner is moot: the runner started the job afresh).
* `detect.restarts` (kept a month): one record per thing the runner did to the job:
  `started`, `restarted` (with the request it obeyed, or the crash it recovered from),
  `crashed`, `gave_up`. That is the restart history an operator reads in Airflow.

What is here is pure (no Airflow import): the record formats, the functions the Kafka
provider's operator and trigger call by dotted path (`restart_request_records`,
`match_restart_record`), and `decide`, the supervisor's verdict.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from spark_jobs.streaming.supervision import parse_time

STATUS_TOPIC = "detect.status"
CONTROL_TOPIC = "detect.control"
RESTARTS_TOPIC = "detect.restarts"
JOB_KEY = "detection-job"
RUNNER_KEY = "runner"

Action = Literal["ok", "restart", "wait", "alert", "fail"]


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def host_name() -> str:
    return socket.gethostname()


# ------------------------------------------------------------------------------ records


def restart_request(request_id: str, reason: str, requested_by: str) -> dict[str, str]:
    """The value of a restart request on the control topic."""
    return {"request_id": request_id, "action": "restart", "reason": reason, "requested_by": requested_by,
            "requested_at": now_iso()}


def restart_request_records(request_id: str, reason: str, requested_by: str) -> list[tuple[bytes, bytes]]:
    """`producer_function` of the Kafka provider's ProduceToTopicOperator: one request."""
    value = restart_request(request_id, reason, requested_by)
    return [(JOB_KEY.encode(), json.dumps(value).encode())]


def match_restart_record(message: Any, request_id: str) -> dict | None:
    """`apply_function` of the provider's AwaitMessageTrigger on the restarts topic: the
    runner's record of having obeyed (or failed to obey) request `request_id`, else None."""
    try:
        record = json.loads(message.value())
    except (TypeError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("request_id") != request_id:
        return None
    return record if record.get("event") in ("restarted", "restart_failed") else None


def parse_record(value: bytes | None) -> dict | None:
    if value is None:
        return None
    try:
        data = json.loads(value)
    except (UnicodeDecodeError, ValueError):
        return None
    return data if isinstance(data, dict) else None


# ------------------------------------------------------------------------------ verdict


@dataclass(frozen=True)
class ControlView:
    """What the supervisor read from the topics at one moment."""

    job_history: Sequence[Mapping] = ()  # the job's status records, oldest first (newest last)
    runner: Mapping | None = None  # the runner's newest status
    last_request: Mapping | None = None  # newest restart request on the control topic
    restarts: Sequence[Mapping] = ()  # restart records, oldest first

    @property
    def job(self) -> Mapping | None:
        return self.job_history[-1] if self.job_history else None

    def answered(self, request_id: str) -> bool:
        return any(r.get("request_id") == request_id for r in self.restarts)


@dataclass
class SupervisorPolicy:
    """Knobs of `decide` (the DAG takes them from its settings)."""

    stale_after_s: float = 60.0  # job status older than this: job dead or hung
    runner_stale_after_s: float = 60.0  # runner status older than this: runner (host) gone
    stall_after_s: float = 120.0  # no batch for this long while the lag grows: stalled
    max_lag: int | None = None  # alert (never restart) above this lag
    request_timeout_s: float = 600.0  # an unanswered request older than this is asked again
    # A driver's JVM, Spark session and first batch take a while: no status for this long
    # after the runner started it is a start in progress, not a dead job.
    start_grace_s: float = 300.0


@dataclass(frozen=True)
class Decision:
    action: Action
    reasons: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _age(value: object, now: datetime) -> float | None:
    t = parse_time(value)
    return None if t is None else (now - t).total_seconds()


def _stalled(history: Sequence[Mapping], now: datetime, stall_after_s: float, lane: bool = False) -> str | None:
    """No batch for stall_after_s while the lag grew over that time: the job is stuck
    (a restart may help), unlike a job that is merely slow (lag, but batches run).
    `lane`: the same for the real-time lane (its batches and lag in `threshold_lane`)."""

    def part(h: Mapping) -> Mapping:
        return (h.get("threshold_lane") or {}) if lane else h

    job = part(history[-1])
    batch_age = _age(job.get("last_batch_time"), now)
    lag = job.get("lag")
    if batch_age is None or batch_age < stall_after_s or not lag:
        return None
    earlier = [part(h) for h in history if (_age(h.get("updated_at"), now) or 0) >= stall_after_s / 2
               and part(h).get("lag") is not None]
    if earlier and int(lag) > int(earlier[-1]["lag"]):
        who = "the real-time lane ran " if lane else ""
        return (f"stalled: {who}no batch for {batch_age:.0f}s (> {stall_after_s:g}s) "
                f"while the lag grew from {earlier[-1]['lag']} to {lag}")
    return None


def decide(view: ControlView, now: datetime, policy: SupervisorPolicy) -> Decision:
    """ok | restart | wait | alert | fail, with the reasons.

    * the runner gave up (crash loop) -> fail, with its reason: restarting would not help;
    * no runner, or its status is stale -> alert: nothing on the driver host obeys;
    * no status from the driver the runner started last (a status older than that start
      is an earlier driver's) -> wait while it is within `start_grace_s`, then alert;
    * a request not answered yet (and not too old) -> wait: never two restarts for one need;
    * the rules need another watermark delay / new topics, the job's status is stale,
      or the job is stalled with a growing lag -> restart (graceful, same checkpoint);
    * the job failed or stopped -> ok: the runner restarts a crashed driver itself;
    * lag above max_lag -> alert; else ok.
    """
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    runner = view.runner
    if runner is None:
        return Decision("alert", ["no runner status on the status topic: is `rulectl runner` running?"])
    if runner.get("state") == "gave_up":
        return Decision("fail", [f"the runner on {runner.get('host')} gave up restarting the job: "
                                 f"{runner.get('reason')}"])
    runner_age = _age(runner.get("updated_at"), now)
    if runner_age is None or runner_age > policy.runner_stale_after_s:
        return Decision("alert", [f"runner on {runner.get('host')} not heard from for "
                                  f"{'?' if runner_age is None else f'{runner_age:.0f}'}s"])
    req = view.last_request
    if req and not view.answered(str(req.get("request_id"))):
        req_age = _age(req.get("requested_at"), now)
        if req_age is not None and req_age < policy.request_timeout_s:
            return Decision("wait", [f"restart {req.get('request_id')} asked {req_age:.0f}s ago is in progress"])
    job = view.job
    driver_started = parse_time(runner.get("driver_started_at"))
    job_time = parse_time(job.get("updated_at")) if job is not None else None
    if driver_started is not None and job_time is not None and job_time < driver_started:
        job = None  # the last word of an earlier driver (before a restart of the platform)
    if job is None:
        if runner.get("state") in ("starting", "backoff", "restarting"):
            return Decision("wait", [f"runner is {runner.get('state')}: no job status yet"])
        since = _age(runner.get("driver_started_at"), now)
        if runner.get("state") == "running" and since is not None and since < policy.start_grace_s:
            return Decision("wait", [f"the job is starting: its driver started {since:.0f}s ago and has not "
                                     f"reported yet (allowed {policy.start_grace_s:g}s)"])
        after = "" if since is None else f" {since:.0f}s after its driver started"
        return Decision("alert", [f"no status from the detection job{after}"])
    reasons: list[str] = []
    if job.get("restart_required"):
        reasons.extend(job.get("restart_reasons") or ["the job says it needs a restart"])
    job_age = _age(job.get("updated_at"), now)
    if job.get("state") == "running" and (job_age is None or job_age > policy.stale_after_s):
        reasons.append(f"status not updated for {'?' if job_age is None else f'{job_age:.0f}'}s: job hung")
    if job.get("state") == "running":
        reasons.extend(r for lane in (False, True) if (r := _stalled(view.job_history, now, policy.stall_after_s, lane)))
    if reasons:
        return Decision("restart", reasons)
    if job.get("state") in ("failed", "stopped"):
        return Decision("ok", [f"job {job.get('state')}: the runner restarts it (runner {runner.get('state')})"])
    lag = job.get("lag")
    if policy.max_lag is not None and lag is not None and lag > policy.max_lag:
        return Decision("alert", [f"lag {lag} records > max_lag {policy.max_lag}"])
    return Decision("ok", [])


def latest_by_key(records: Iterable[tuple[bytes | None, bytes | None]]) -> dict[str, dict]:
    """key -> newest parsed value (records in log order)."""
    out: dict[str, dict] = {}
    for key, value in records:
        if key is None:
            continue
        parsed = parse_record(value)
        if parsed is not None:
            out[key.decode(errors="replace")] = parsed
    return out


def airflow_connections(bootstrap: str, security: Mapping[str, str] | None = None,
                        group_id: str = "detection-supervisor") -> dict[str, dict]:
    """The supervisor's two Kafka provider connections (LocalFilesystemBackend JSON form):
    `detect_kafka` (reads; a group for the AwaitMessageSensor's commits) and
    `detect_kafka_producer` (requests: acks=all, idempotent). `security`: the SASL
    settings of the `supervisor` principal (`client_config.confluent_config`), which the
    Kafka provider passes to confluent-kafka from the connection's extra; the file that
    holds them must be readable by its owner only (`rulectl up`: connections.json, 0600;
    docker/: the airflow_connections secret)."""
    sec = dict(security or {})
    read = {"bootstrap.servers": bootstrap, "group.id": group_id, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, **sec}
    write = {"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, **sec}
    return {"detect_kafka": {"conn_type": "kafka", "extra": read},
            "detect_kafka_producer": {"conn_type": "kafka", "extra": write}}


def airflow_connection_env(bootstrap: str, group_id: str = "detection-supervisor") -> dict[str, str]:
    """The same connections as `AIRFLOW_CONN_*` variables, for a broker without
    credentials only (an environment is no place for a password)."""
    return {f"AIRFLOW_CONN_{cid.upper()}": json.dumps(conn)
            for cid, conn in airflow_connections(bootstrap, None, group_id).items()}
