"""Issue 13 item 6: Kafka with SASL/SCRAM users and ACLs is the default, and every client
of the platform authenticates as its role.

The platform is started the way a user starts it: `rulectl up` (without Airflow, to
spare the two cores), which generates the principals' passwords into the work folder,
runs the broker with SCRAM listeners and ACLs, publishes the rules as `publisher`, and
runs the real detection job (`rulectl runner` -> `rulectl detect`, Spark's Kafka
connector as `detector`) and the demo generator (`producer`). The test's own clients
take their credentials from the same file through `KAFKA_CREDENTIALS_FILE`, as a user's
shell would.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer

from spark_jobs.kafka.admin import read_all
from spark_jobs.kafka.broker import free_port
from spark_jobs.kafka.client_config import (
    CREDENTIALS_ENV,
    KafkaClientSettings,
    confluent_config,
    spark_options,
)
from spark_jobs.kafka.spark_io import read_stream

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- Spark redaction


def test_spark_plans_never_show_the_sasl_options(spark, tmp_path: Path) -> None:
    """Spark 4.2 redacts a data source option in plans when its key or value matches
    `spark.sql.redaction.options.regex` (default `(?i)url`) or `spark.redaction.regex`
    (`secret|password|token|access.key`). A SCRAM JAAS line is caught by the latter only
    because it contains the word "password"; the session's own regex names the SASL
    keys, so a login module whose line lacks that word stays hidden too (this fails on
    Spark's defaults)."""
    creds = tmp_path / "creds.json"
    creds.write_text(json.dumps({"detector": "Zq9xK7mQ-not-a-word"}))
    kafka = KafkaClientSettings(credentials_file=str(creds))
    opts = spark_options("detector", kafka)
    assert "ScramLoginModule" in opts["kafka.sasl.jaas.config"] and "Zq9xK7mQ" in opts["kafka.sasl.jaas.config"]
    wordless = {**opts, "kafka.sasl.jaas.config": opts["kafka.sasl.jaas.config"].replace("password=", "pw=")}
    for options in (opts, wordless):
        df = read_stream(spark, "127.0.0.1:1", ["events.raw"], options=options)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            df.explain(True)
        plan = out.getvalue() + df._jdf.queryExecution().logical().toString()
        assert "kafka.sasl.jaas.config=*********(redacted)" in plan, plan[:2000]
        assert "Zq9xK7mQ" not in plan


# ----------------------------------------------------------------------------- the platform as `rulectl up` runs it


def _wait(pred, timeout: float, what: str, proc: subprocess.Popen | None = None, log: Path | None = None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-4000:] if log else ""
            raise RuntimeError(f"rulectl up exited with {proc.returncode} while waiting for {what}:\n{tail}")
        got = pred()
        if got:
            return got
        time.sleep(0.5)
    tail = log.read_text(errors="replace")[-4000:] if log else ""
    raise TimeoutError(f"{what}: not in {timeout}s\n{tail}")


def _status(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("up")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in (CREDENTIALS_ENV, "KAFKA_PRINCIPAL")}
    out = work / "up.out"
    cmd = [sys.executable, "-m", "spark_jobs.cli", "up", "--no-airflow", "--port", str(port), "--workdir", str(work),
           "--demo-rate", "2", "--partitions", "1", "--trigger-ms", "500"]
    with out.open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env, start_new_session=True)
    status_file = work / "detect" / "status.json"
    try:
        _wait(lambda: _status(status_file).get("state") == "running" and _status(status_file).get("last_batch_id")
              is not None, 300, "the detection job running", proc, out)
        yield {"work": work, "bootstrap": f"127.0.0.1:{port}", "proc": proc, "out": out, "status": status_file,
               "creds": work / "kafka-credentials.json"}
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(150)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)


@pytest.fixture
def as_user(platform, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's clients use the platform's credentials file (and its signing key)."""
    monkeypatch.setenv(CREDENTIALS_ENV, str(platform["creds"]))
    monkeypatch.delenv("KAFKA_PRINCIPAL", raising=False)
    monkeypatch.setenv("RULES_SIGNING_KEY_FILE", str(platform["work"] / "rules-signing.key"))
    return platform["creds"]


def _produce(bootstrap: str, topic: str, value: bytes, conf: dict, key: bytes | None = None) -> str | None:
    """One record; the error the broker answered, or None when written."""
    errors: list[str] = []
    p = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 10000, "enable.idempotence": False, **conf})
    p.produce(topic, key=key, value=value, on_delivery=lambda err, _m: errors.append(str(err)) if err else None)
    left = p.flush(20)
    return errors[0] if errors else ("not delivered" if left else None)


def test_up_generates_private_credentials_and_never_prints_them(platform) -> None:
    creds = platform["creds"]
    assert creds.stat().st_mode & 0o777 == 0o600
    passwords = json.loads(creds.read_text())
    assert set(passwords) >= {"admin", "publisher", "detector", "supervisor", "producer", "reader"}
    assert len(set(passwords.values())) == len(passwords) and all(len(p) >= 20 for p in passwords.values())
    # The broker's config holds the admin's JAAS line: owner only as well.
    assert (platform["work"] / "kafka" / "server.properties").stat().st_mode & 0o777 == 0o600
    said = platform["out"].read_text(errors="replace")
    assert "SASL/SCRAM + ACLs" in said and str(creds) in said
    texts = [said, platform["status"].read_text(), (platform["work"] / "platform.json").read_text()]
    texts += [f.read_text(errors="replace") for f in (platform["work"] / "logs").glob("*.log")]
    for pw in passwords.values():
        assert not any(pw in t for t in texts)


def test_the_job_reads_and_writes_as_detector_and_the_demo_produces_as_producer(platform, as_user) -> None:
    bs = platform["bootstrap"]
    order = f"o-{uuid.uuid4().hex[:10]}"
    event = {"type": "purchase", "value": 99, "user_id": "u_sec", "order_id": order,
             "timestamp": "2026-01-05T12:00:01.000Z"}
    assert _produce(bs, "events.raw", json.dumps(event).encode(), confluent_config("producer")) is None

    def detected() -> list[dict]:
        recs = [json.loads(r.value) for r in read_all(bs, "events.processed", role="reader")]
        return [d for d in recs if d.get("order_id") == order]

    dets = _wait(detected, 120, "the detection of the produced purchase")
    assert {d["rule_id"] for d in dets} == {"purchase_threshold"}
    # The demo generator (`producer`) got its events in, and the job has read them.
    assert read_all(bs, "context.raw", role="reader")
    # The job's status record on the status topic, read as the supervisor reads it.
    status = [r for r in read_all(bs, "detect.status", role="supervisor") if r.key == b"detection-job"]
    assert status and json.loads(status[-1].value)["state"] == "running"
    # No password in what the job reports (its progress, status) or logs.
    passwords = json.loads(as_user.read_text()).values()
    text = platform["status"].read_text() + status[-1].value.decode()
    text += "".join(f.read_text(errors="replace") for f in (platform["work"] / "logs").glob("*.log"))
    assert not any(pw in text for pw in passwords)


def test_only_the_publisher_writes_rules_and_strangers_get_nothing(platform, as_user) -> None:
    bs = platform["bootstrap"]
    forged = json.dumps({"rule_id": "purchase_threshold", "version": "99", "rule_type": "threshold",
                         "source_topic": "events.raw", "conditions": [{"field": "value", "operator": ">=", "value": 0}]})
    # The detection job's own credentials may not write the rules.
    err = _produce(bs, "rules.active", forged.encode(), confluent_config("detector"), b"purchase_threshold")
    assert err is not None and "TOPIC_AUTHORIZATION_FAILED" in err.upper().replace(" ", "_"), err
    # Neither may an event producer, nor a client without credentials (it does not get in).
    assert _produce(bs, "rules.active", forged.encode(), confluent_config("producer"), b"purchase_threshold")
    assert _produce(bs, "rules.active", forged.encode(), {}, b"purchase_threshold") is not None
    assert _produce(bs, "events.raw", b"{}", {}) is not None

    # The release path publishes (signed, as `publisher`) and the running job applies it.
    from spark_jobs.kafka.publisher import publish_rules
    from spark_jobs.rules.loader import load_rules

    rule = next(lr.rule for lr in load_rules([str(ROOT / "rules")]).rules if lr.rule.rule_id == "purchase_threshold")
    bumped = rule.model_copy(update={"version": "2", "name": "Purchase of 20 or more (v2)"})
    result = publish_rules([bumped], bs, published_by="test_kafka_security")
    assert [r.version for r in result.published] == ["2"]
    _wait(lambda: (_status(platform["status"]).get("rule_versions") or {}).get("purchase_threshold") == "2",
          90, "the job running version 2")
    order = f"o-{uuid.uuid4().hex[:10]}"
    event = {"type": "purchase", "value": 50, "user_id": "u_sec", "order_id": order,
             "timestamp": "2026-01-05T12:00:02.000Z"}
    assert _produce(bs, "events.raw", json.dumps(event).encode(), confluent_config("producer")) is None

    def detected() -> list[dict]:
        return [d for d in (json.loads(r.value) for r in read_all(bs, "events.processed", role="reader"))
                if d.get("order_id") == order]

    dets = _wait(detected, 120, "a detection by version 2")
    assert [d["rule_version"] for d in dets] == ["2"]


def test_up_stops_cleanly(platform) -> None:
    proc = platform["proc"]
    proc.send_signal(signal.SIGINT)
    assert proc.wait(150) == 0
    assert "platform stopped" in platform["out"].read_text(errors="replace")
