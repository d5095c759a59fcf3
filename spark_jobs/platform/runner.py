"""`rulectl runner`: keep the detection job's driver running on its host, obey the control topic.

Airflow supervises from elsewhere (dags/detection_supervisor.py), so something on the
driver host must own the driver process. This runner:

* starts `rulectl detect ...` (client mode on a `spark://` master, or local) as a child
  in its own process group, and forwards a SIGTERM to it when told to stop;
* restarts a crashed driver on the same checkpoint (nothing lost: the checkpoint has the
  offsets) after a backoff that grows per crash (tenacity's exponential wait); a driver
  that crashes `max_crashes` times in a row, each within `healthy_after_s` of its start,
  is a crash loop: the runner stops restarting, records why (exit code, log tail) and
  exits 1, which the supervisor DAG turns into a failed run with that reason;
* obeys restart requests from `detect.control` (see spark_jobs.platform.control):
  SIGTERM (the job finishes the batch in flight and exits 0), then the same command on
  the same checkpoint; a job that does not stop within `graceful_timeout_s` is killed;
* records every start, restart, crash and the giving up to `detect.restarts` (who or
  what asked, why, when) and its own state to `detect.status` key `runner`.

The job itself is unchanged: the runner only starts it and signals it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import OFFSET_END, Consumer, KafkaError, Producer, TopicPartition
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from spark_jobs.kafka.admin import assign_consumer, create_topics, end_offsets
from spark_jobs.kafka.broker import topic_specs
from spark_jobs.kafka.client_config import with_bootstrap
from spark_jobs.platform import control

log = logging.getLogger(__name__)

# The runner lives on the driver host with the job and acts as the job's principal
# (reads detect.control, writes detect.restarts and its status).
ROLE = "detector"


class DriverCrashed(RuntimeError):
    """The driver exited with an error soon after it started."""


@dataclass
class RunnerConfig:
    bootstrap: str
    detect_args: Sequence[str]  # arguments of `rulectl detect` (without --bootstrap)
    control_topic: str = control.CONTROL_TOPIC
    restarts_topic: str = control.RESTARTS_TOPIC
    status_topic: str = control.STATUS_TOPIC
    max_crashes: int = 3
    healthy_after_s: float = 120.0  # a driver up this long before crashing is not a crash loop
    backoff_s: float = 2.0
    max_backoff_s: float = 60.0
    graceful_timeout_s: float = 120.0
    status_every_s: float = 2.0
    log_path: Path | None = None  # the driver's output (default: inherited)
    name: str = control.JOB_KEY


def detect_command(cfg: RunnerConfig) -> list[str]:
    """The driver's command line: `rulectl detect --bootstrap B ...` with this interpreter."""
    return [sys.executable, "-m", "spark_jobs.cli", "detect", "--bootstrap", cfg.bootstrap,
            "--status-topic", cfg.status_topic, *cfg.detect_args]


class Runner:
    """See the module docstring. `run()` blocks until `stop` is set (exit 0) or the
    driver is in a crash loop (exit 1)."""

    def __init__(self, cfg: RunnerConfig, stop: threading.Event | None = None) -> None:
        self.cfg = cfg
        self.stop = stop or threading.Event()
        self.child: subprocess.Popen[bytes] | None = None
        self.child_started = 0.0
        self.child_started_at: str | None = None  # wall clock, for the supervisor's start grace
        self.state = "starting"
        self.reason: str | None = None
        self.restarts_total = 0
        self.started_at = control.now_iso()
        self._last_status = 0.0
        self._producer = Producer(with_bootstrap(cfg.bootstrap, ROLE, {"acks": "all", "enable.idempotence": True,
                                                                        "linger.ms": 0}))
        self._control: Consumer | None = None
        self._after_crash = False  # the next start is a restart after a crash (recorded)

    # ------------------------------------------------------------------ records

    def _produce(self, topic: str, key: str, value: dict) -> None:
        self._producer.produce(topic, key=key.encode(), value=json.dumps(value).encode())
        self._producer.flush(30)

    def record(self, event: str, reason: str, by: str = "runner", request_id: str | None = None,
               exit_code: int | None = None) -> dict:
        """One line of the restart history (who or what, why, when) on the restarts topic."""
        rec = {"event": event, "job": self.cfg.name, "reason": reason, "by": by, "at": control.now_iso(),
               "host": control.host_name(), "runner_pid": os.getpid(),
               "driver_pid": self.child.pid if self.child else None}
        if request_id is not None:
            rec["request_id"] = request_id
        if exit_code is not None:
            rec["exit_code"] = exit_code
        self._produce(self.cfg.restarts_topic, self.cfg.name, rec)
        log.info("runner: %s (%s) by %s", event, reason, by)
        self.publish_status(force=True)
        return rec

    def publish_status(self, force: bool = False) -> None:
        if not force and time.monotonic() - self._last_status < self.cfg.status_every_s:
            return
        self._last_status = time.monotonic()
        self._produce(self.cfg.status_topic, control.RUNNER_KEY, {
            "state": self.state, "reason": self.reason, "host": control.host_name(), "pid": os.getpid(),
            "driver_pid": self.child.pid if self.child and self.child.poll() is None else None,
            "driver_started_at": self.child_started_at,
            "started_at": self.started_at, "updated_at": control.now_iso(), "restarts_total": self.restarts_total,
            "command": detect_command(self.cfg),
        })

    # ------------------------------------------------------------------ the child

    def _start_child(self) -> None:
        out = open(self.cfg.log_path, "ab") if self.cfg.log_path else None  # noqa: SIM115 - the child keeps it
        try:
            self.child = subprocess.Popen(detect_command(self.cfg), stdout=out, stderr=subprocess.STDOUT if out else None,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            if out is not None:
                out.close()
        self.child_started = time.monotonic()
        self.child_started_at = control.now_iso()
        self.state = "running"
        self.publish_status(force=True)

    def _stop_child(self) -> int | None:
        """SIGTERM (graceful: the batch in flight finishes), then SIGKILL of the group."""
        child = self.child
        if child is None or child.poll() is not None:
            return child.returncode if child else None
        child.send_signal(signal.SIGTERM)
        try:
            return child.wait(self.cfg.graceful_timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("runner: driver %s did not stop in %ss: killing it", child.pid, self.cfg.graceful_timeout_s)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            return child.wait(30)
        finally:
            self._reap_group(child.pid)

    @staticmethod
    def _reap_group(pgid: int) -> None:
        """Whatever the driver left in its group (its Spark JVM after a SIGKILL) goes too."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)

    def _log_tail(self, n: int = 800) -> str:
        if not self.cfg.log_path:
            return ""
        try:
            lines = [ln for ln in Path(self.cfg.log_path).read_text(errors="replace").splitlines() if " WARN " not in ln]
        except OSError:
            return ""
        return "\n".join(lines[-8:])[-n:]

    # ------------------------------------------------------------------ control topic

    def _open_control(self) -> None:
        """Read the control topic from its current end: requests older than this runner
        are moot (it starts the job afresh)."""
        create_topics(self.cfg.bootstrap, topic_specs(
            [self.cfg.control_topic, self.cfg.restarts_topic, self.cfg.status_topic],
            replication=-1), role=ROLE)
        self._control = assign_consumer(self.cfg.bootstrap, role=ROLE)
        ends = end_offsets(self._control, [(self.cfg.control_topic, 0)])
        self._control.assign([TopicPartition(self.cfg.control_topic, 0, ends[(self.cfg.control_topic, 0)][1]
                                             if ends else OFFSET_END)])

    def _requests(self) -> list[dict]:
        assert self._control is not None
        out = []
        for msg in self._control.consume(num_messages=100, timeout=0.2):
            if msg.error() is not None:
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    log.warning("runner: control topic error: %s", msg.error())
                continue
            if msg.key() != self.cfg.name.encode():
                continue
            req = control.parse_record(msg.value())
            if req and req.get("action") == "restart":
                out.append(req)
        return out

    # ------------------------------------------------------------------ main loop

    def _supervise_child(self) -> None:
        """Run the driver until the runner is told to stop; obey restart requests.

        Returns when stopping, or when a driver that had run healthily crashed (the
        caller restarts it with a fresh crash budget); raises DriverCrashed when it
        crashed soon after its start (the caller backs off and retries, then gives up).
        """
        if self.stop.is_set():
            return
        self._start_child()
        assert self.child is not None
        while True:
            if self.stop.is_set():
                self.state = "stopping"
                self.publish_status(force=True)
                self._stop_child()
                return
            for req in self._requests():
                rid, by = str(req.get("request_id")), str(req.get("requested_by") or "unknown")
                self.state, self.reason = "restarting", str(req.get("reason"))
                self.publish_status(force=True)
                rc = self._stop_child()
                self._start_child()
                self.restarts_total += 1
                self.record("restarted", f"{req.get('reason')} (previous driver exited {rc})", by=by,
                            request_id=rid, exit_code=rc)
            rc = self.child.poll()
            if rc is not None:
                self._reap_group(self.child.pid)
                ran = time.monotonic() - self.child_started
                if rc == 0:
                    # Stopped by someone else (a SIGTERM not from this runner): run it again.
                    self._start_child()
                    self.restarts_total += 1
                    self.record("restarted", "driver exited 0 without a request", exit_code=0)
                    continue
                reason = f"driver exited with {rc} after {ran:.0f}s" + (f": {self._log_tail()}" if self._log_tail() else "")
                self.state, self.reason = "crashed", reason
                self._after_crash = True
                self.record("crashed", reason, exit_code=rc)
                if ran >= self.cfg.healthy_after_s:
                    return  # a crash after a healthy run: restart at once, budget afresh
                raise DriverCrashed(reason)
            self.publish_status()
            self.stop.wait(0.3)

    def _before_sleep(self, rs: RetryCallState) -> None:
        wait = rs.next_action.sleep if rs.next_action else 0
        self.state = "backoff"
        self.publish_status(force=True)
        log.warning("runner: driver crashed (%d of %d); restarting in %.1fs", rs.attempt_number,
                    self.cfg.max_crashes, wait)

    def run(self) -> int:
        self._open_control()
        self.record("started", f"runner started: {' '.join(detect_command(self.cfg))}")
        try:
            while not self.stop.is_set():
                retrying = Retrying(
                    stop=stop_after_attempt(self.cfg.max_crashes),
                    wait=wait_exponential(multiplier=self.cfg.backoff_s, max=self.cfg.max_backoff_s),
                    retry=retry_if_exception_type(DriverCrashed),
                    before_sleep=self._before_sleep,
                    sleep=self.stop.wait,
                    reraise=True,
                )
                try:
                    for attempt in retrying:
                        with attempt:
                            if self._after_crash and not self.stop.is_set():
                                self._after_crash = False
                                self.restarts_total += 1
                                self.record("restarted", f"after a crash ({self.reason})")
                            self._supervise_child()
                except DriverCrashed as exc:
                    self.state = "gave_up"
                    self.reason = f"crash loop: {self.cfg.max_crashes} crashes within {self.cfg.healthy_after_s:g}s of start; last: {exc}"
                    self.record("gave_up", self.reason)
                    log.error("runner: %s", self.reason)
                    return 1
            self.state = "stopped"
            self.reason = "runner stopped"
            self.publish_status(force=True)
            return 0
        finally:
            self._stop_child()
            if self._control is not None:
                self._control.close()
            self._producer.flush(10)
