"""Supervision without shared hosts, for real: a broker, `rulectl runner` running the job,
and the detection_supervisor DAG run by Airflow on PostgreSQL. Between Airflow and the
job there are only Kafka topics (no pid file, no status file, no signal from Airflow).

- the driver is SIGKILLed: the runner restarts it on its checkpoint, nothing is lost;
- a threshold-only change: the DAG restarts nothing;
- a rule that raises the watermark delay: exactly one graceful restart, the new status
  shows the new delay, and the next run restarts nothing;
- a driver that crashes at start: the runner gives up after three, the DAG run fails
  with the reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from airflow_fixtures import airflow_env  # noqa: F401
from cluster_helpers import wait_until
from confluent_kafka import Producer
from detect_harness import detections
from reference_engine import RefEvent, evaluate

from spark_jobs.kafka.admin import read_all
from spark_jobs.kafka.broker import DEFAULT_TOPICS, EmbeddedBroker, free_port
from spark_jobs.kafka.publisher import publish_rules
from spark_jobs.rules.model import parse_rule

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.airflow, pytest.mark.slow]

VELOCITY = {"rule_id": "burst_per_user", "version": "1", "rule_type": "velocity", "source_topic": "events.raw",
            "group_by": "user", "window_size": 4, "window_unit": "seconds", "aggregation_type": "count",
            "threshold": 4, "emit_mode": "last_event", "time_mode": "event_time", "timestamp_field": "ts",
            "watermark_delay": 10}
THRESHOLD = {"rule_id": "big_amount", "version": "1", "rule_type": "threshold", "source_topic": "events.raw",
             "conditions": [{"field": "amount", "operator": ">=", "value": 95}]}


def _events(start: int, n: int, t0: datetime) -> list[str]:
    import random

    rng = random.Random(start)
    out, t = [], t0
    for i in range(start, start + n):
        t += timedelta(milliseconds=rng.randint(1, 150))
        out.append(json.dumps({"eid": i, "user": f"u{rng.randint(0, 19)}", "amount": rng.randint(1, 100),
                               "ts": t.isoformat().replace("+00:00", "Z")}))
    return out


def _produce(bootstrap: str, values: list[str]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5})
    for v in values:
        p.produce("events.raw", key=json.loads(v)["user"].encode(), value=v.encode())
    assert p.flush(60) == 0


def _latest(bootstrap: str, topic: str, key: str) -> dict:
    found: dict = {}
    for r in read_all(bootstrap, topic):
        if r.key == key.encode() and r.value:
            found = json.loads(r.value)
    return found


def _records(bootstrap: str, topic: str) -> list[dict]:
    return [json.loads(r.value) for r in read_all(bootstrap, topic) if r.value]


class RunnerProc:
    """`rulectl runner ... -- <detect args>` as a process of its own (the driver host)."""

    def __init__(self, bootstrap: str, work: Path, checkpoint: Path, name: str) -> None:
        self.log = work / f"{name}.log"
        cmd = [sys.executable, "-m", "spark_jobs.cli", "runner", "--bootstrap", bootstrap, "--healthy-after", "30",
               "--backoff", "1", "--max-backoff", "4", "--log", str(work / f"{name}-driver.log"), "--",
               "--checkpoint", str(checkpoint), "--trigger-ms", "500"]
        self.proc = subprocess.Popen(cmd, stdout=self.log.open("ab"), stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                return self.proc.wait(180)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.wait(30)


@pytest.fixture(scope="module")
def platform(tmp_path_factory, airflow_env):  # noqa: F811
    work = tmp_path_factory.mktemp("supervision")
    broker = EmbeddedBroker(port=free_port(), topics=DEFAULT_TOPICS, data_dir=work / "kafka").start()
    b = broker.bootstrap
    conns = {
        "AIRFLOW_CONN_DETECT_KAFKA": json.dumps({"conn_type": "kafka", "extra": {
            "bootstrap.servers": b, "group.id": "detection-supervisor", "auto.offset.reset": "earliest",
            "enable.auto.commit": False}}),
        "AIRFLOW_CONN_DETECT_KAFKA_PRODUCER": json.dumps({"conn_type": "kafka", "extra": {
            "bootstrap.servers": b, "acks": "all", "enable.idempotence": True}}),
        "DETECTION_SUPERVISOR_STALE_AFTER_S": "60",
        "DETECTION_SUPERVISOR_RESTART_TIMEOUT_S": "300",
    }
    airflow_env.env.update(conns)
    runners: list[RunnerProc] = []
    try:
        yield broker, work, runners, airflow_env
    finally:
        for r in runners:
            r.stop()
        for k in conns:
            airflow_env.env.pop(k, None)
        broker.stop()


def _dag_run(af, name: str):
    run = af.start_dag_test("detection_supervisor", log_name=name)
    rc = run.wait(600)
    run_id = af.latest_run("detection_supervisor")["dag_run_id"]
    return rc, run_id, af.task_states("detection_supervisor", run_id), run.output()


def _job_status(b: str) -> dict:
    return _latest(b, "detect.status", "detection-job")


def test_runner_restarts_a_killed_driver_and_nothing_is_lost(platform) -> None:
    broker, work, runners, _ = platform
    b = broker.bootstrap
    publish_rules([parse_rule(VELOCITY), parse_rule(THRESHOLD)], b)
    t0 = datetime(2026, 4, 1, tzinfo=UTC)
    first = _events(0, 1500, t0)
    _produce(b, first)
    runners.append(RunnerProc(b, work, work / "checkpoint", "runner"))
    wait_until(lambda: _job_status(b).get("state") == "running" and _job_status(b).get("lag") == 0, 300,
               "the job running, the first wave read")
    before = _job_status(b)
    driver = _latest(b, "detect.status", "runner")["driver_pid"]
    # A crash of the driver host's process and its Spark JVM: nothing gets to clean up.
    kids = subprocess.run(["pgrep", "-P", str(driver)], capture_output=True, text=True).stdout.split()
    os.kill(driver, signal.SIGKILL)
    for k in kids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(k), signal.SIGKILL)
    second = _events(1500, 1500, datetime.fromisoformat(json.loads(first[-1])["ts"].replace("Z", "+00:00")))
    _produce(b, second)
    after = wait_until(lambda: (s := _job_status(b)).get("run_id") != before["run_id"] and s.get("state") == "running"
                       and s.get("lag") == 0 and s, 300, "a new run of the job that read everything")
    assert after["query_id"] == before["query_id"], "not the same checkpoint"
    time.sleep(3)
    events = first + second
    refs = evaluate([parse_rule(VELOCITY), parse_rule(THRESHOLD)],
                    [RefEvent("events.raw", v, i) for i, v in enumerate(events)])
    live = detections(b)
    ids: dict[tuple[str, int], set[str]] = {}
    for d in live:
        ids.setdefault((d["rule_id"], d["eid"]), set()).add(d["detection_id"])
    assert set(ids) == {(r.rule_id, json.loads(r.raw)["eid"]) for r in refs}
    assert all(len(v) == 1 for v in ids.values())
    history = _records(b, "detect.restarts")
    assert [h["event"] for h in history if h["by"] == "runner"][-2:] == ["crashed", "restarted"]


def test_threshold_only_change_restarts_nothing(platform) -> None:
    broker, _, _, af = platform
    b = broker.bootstrap
    publish_rules([parse_rule(VELOCITY), parse_rule({**THRESHOLD, "version": "2",
                                                       "conditions": [{"field": "amount", "operator": ">=",
                                                                       "value": 90}]})], b)
    wait_until(lambda: _job_status(b).get("rule_versions", {}).get("big_amount") == "2", 120, "the new version live")
    run_id_before = _job_status(b)["run_id"]
    n_control, n_restarts = len(_records(b, "detect.control")), len(_records(b, "detect.restarts"))
    rc, run_id, states, out = _dag_run(af, "threshold-only")
    assert rc == 0, out[-5000:]
    assert states["healthy"] == "success" and states["request_restart"] == "skipped", states
    assert len(_records(b, "detect.control")) == n_control
    assert len(_records(b, "detect.restarts")) == n_restarts
    assert _job_status(b)["run_id"] == run_id_before


def test_raised_watermark_delay_gives_exactly_one_graceful_restart(platform) -> None:
    broker, _, _, af = platform
    b = broker.bootstrap
    publish_rules([parse_rule({**VELOCITY, "version": "2", "watermark_delay": 30})], b)
    wait_until(lambda: _job_status(b).get("restart_required"), 120, "the job asking for a restart")
    before = _job_status(b)
    assert before["watermark_delay_s"] == 10
    rc, run_id, states, out = _dag_run(af, "watermark")
    assert rc == 0, out[-5000:]
    assert states["request_restart"] == states["await_restart"] == states["confirm_restart"] == "success", states
    answers = [r for r in _records(b, "detect.restarts") if r.get("request_id") == f"detection_supervisor/{run_id}"]
    assert [a["event"] for a in answers] == ["restarted"]
    assert answers[0]["by"] == f"airflow:detection_supervisor/{run_id}" and "watermark" in answers[0]["reason"]
    assert answers[0]["exit_code"] == 0  # graceful: the job finished its batch and exited 0
    now = _job_status(b)
    assert now["watermark_delay_s"] == 30 and not now["restart_required"]
    assert now["run_id"] != before["run_id"] and now["query_id"] == before["query_id"]
    # The next run sees a healthy job: no second restart.
    n = len(_records(b, "detect.restarts"))
    rc, _, states, out = _dag_run(af, "watermark-after")
    assert rc == 0 and states["healthy"] == "success", out[-5000:]
    assert len(_records(b, "detect.restarts")) == n
    # The restart (what, by whom, why) is in Airflow: the health check's task log.
    assert f"restarted by airflow:detection_supervisor/{run_id}: rules need watermark delay" in out, out[-5000:]


def test_crash_loop_stops_restarts_and_fails_the_run(platform) -> None:
    broker, work, runners, af = platform
    b = broker.bootstrap
    for r in runners:
        assert r.stop() == 0
    bad = work / "not-a-folder"
    bad.write_text("a checkpoint path that is a file: the driver crashes at start")
    crashing = RunnerProc(b, work, bad, "crashing")
    runners.append(crashing)
    assert crashing.proc.wait(300) == 1, crashing.log.read_text()[-3000:]
    mine = [r for r in _records(b, "detect.restarts") if r.get("runner_pid") == crashing.proc.pid]
    assert [r["event"] for r in mine] == ["started", "crashed", "restarted", "crashed", "restarted", "crashed",
                                          "gave_up"]
    rc, run_id, states, out = _dag_run(af, "crash-loop")
    assert rc != 0
    assert states["fail"] == "failed" and states["request_restart"] == "skipped", states
    assert "crash loop" in out and "gave up" in out
    assert [r for r in _records(b, "detect.restarts") if r.get("runner_pid") == crashing.proc.pid] == mine
