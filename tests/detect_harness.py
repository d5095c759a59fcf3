"""Drive the real detection job (`rulectl detect` in its own process, its own Spark)
against a real broker, as an operator would: start, watch the status file, SIGTERM or
SIGKILL, restart on the same checkpoint."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from confluent_kafka import Producer

from spark_jobs.kafka.admin import create_topics, read_all

# Every job a test started, so that one a failing test never stopped is killed when its
# module ends (tests/conftest.py) instead of loading the machine for the rest of the run.
STARTED: list[DetectJob] = []


class DetectJob:
    def __init__(self, bootstrap: str, workdir: Path, sink: str = "events.processed", dlq: str = "events.deadletter",
                 rules_topic: str = "rules.active", trigger_ms: int = 500, max_offsets_per_trigger: int = 100_000,
                 extra_args: tuple[str, ...] = (), cli: tuple[str, ...] = ("-m", "spark_jobs.cli")) -> None:
        self.bootstrap = bootstrap
        self.workdir = workdir
        self.checkpoint = workdir / "checkpoint"
        self.sink, self.dlq, self.rules_topic = sink, dlq, rules_topic
        self.trigger_ms = trigger_ms
        self.max_offsets_per_trigger = max_offsets_per_trigger
        self.extra_args = tuple(extra_args)  # e.g. ("--master", "spark://...")
        self.cli = tuple(cli)  # what runs `detect`: python's arguments before it
        self.proc: subprocess.Popen | None = None
        self.log = workdir / "detect.log"
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def status_file(self) -> Path:
        return self.checkpoint / "status.json"

    def start(self, timeout: float = 180) -> dict:
        if self.status_file.exists():
            self.status_file.unlink()
        cmd = [sys.executable, *self.cli, "detect", "--bootstrap", self.bootstrap,
               "--checkpoint", str(self.checkpoint), "--sink-topic", self.sink, "--dead-letter-topic", self.dlq,
               "--rules-topic", self.rules_topic, "--trigger-ms", str(self.trigger_ms),
               "--max-offsets-per-trigger", str(self.max_offsets_per_trigger), *self.extra_args]
        log = self.log.open("ab")
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
        if self not in STARTED:  # a job started again is one job
            STARTED.append(self)
        return self.wait_for(lambda s: s.get("state") == "running" and s.get("last_batch_id") is not None, timeout)

    def status(self) -> dict:
        try:
            return json.loads(self.status_file.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def wait_for(self, pred, timeout: float = 120) -> dict:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc is not None and not self.running():
                raise RuntimeError(f"detection job exited with {self.proc.returncode}:\n{self.tail_log()}")
            s = self.status()
            if s and pred(s):
                return s
            time.sleep(0.25)
        raise TimeoutError(f"status never satisfied the condition; last status: {self.status()}\n{self.tail_log()}")

    def batches_after(self, n: int, timeout: float = 120) -> dict:
        """Wait until `n` more micro-batches have completed."""
        start = self.status().get("last_batch_id") or 0
        return self.wait_for(lambda s: (s.get("last_batch_id") or 0) >= start + n, timeout)

    def stop(self, timeout: float = 90) -> int:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            # A job that does not stop must not outlive its test: it would load the
            # machine for every test after it.
            self.kill()
            raise

    def kill(self) -> None:
        """SIGKILL the job and its JVM: a crash, nothing gets to clean up."""
        assert self.proc is not None
        children = subprocess.run(["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True).stdout.split()
        self.proc.kill()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
        self.proc.wait(30)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def tail_log(self, n: int = 60) -> str:
        lines = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return "\n".join(line for line in lines if "WARN" not in line)[-6000:] or "\n".join(lines[-n:])


def produce(bootstrap: str, topic: str, values: list[str], key: str | None = None) -> None:
    """Produce and confirm delivery; the topic is created first (the broker does not
    create topics on first use)."""
    create_topics(bootstrap, [topic])
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    errors: list[str] = []
    for v in values:
        p.produce(topic, value=v.encode(), key=key.encode() if key else None,
                  on_delivery=lambda err, _msg: errors.append(str(err)) if err else None)
    assert p.flush(30) == 0 and not errors, errors


def detections(bootstrap: str, topic: str = "events.processed") -> list[dict]:
    return [json.loads(r.value) for r in read_all(bootstrap, topic)]


def wait_detections(bootstrap: str, topic: str, pred, timeout: float = 120) -> list[dict]:
    deadline = time.time() + timeout
    dets: list[dict] = []
    while time.time() < deadline:
        dets = detections(bootstrap, topic)
        if pred(dets):
            return dets
        time.sleep(0.5)
    raise TimeoutError(f"{len(dets)} records on {topic}; condition not met")


def same_value(a: object, b: object) -> bool:
    """Equal, but floats to within 1e-12 relative: the numeric rule (README) sums
    exactly and rounds once, and the live job and the backtest round differently in the
    last bits (Known limits), never more."""
    if isinstance(a, float) or isinstance(b, float):
        return isinstance(a, int | float) and isinstance(b, int | float) and math.isclose(
            a, b, rel_tol=1e-12, abs_tol=1e-12)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    return a == b


def assert_same_detections(got: list[dict], expected: list[dict]) -> None:
    """The same detections (by id), member for member, but the time of the decision."""
    assert sorted(d["detection_id"] for d in got) == sorted(d["detection_id"] for d in expected)
    live = {d["detection_id"]: d for d in got}
    for want in expected:
        have = live[want["detection_id"]]
        assert set(have) == set(want), (have, want)
        for key, value in want.items():
            if key != "processed":
                assert same_value(have[key], value), (key, have, want)


@contextlib.contextmanager
def job_state_store(spark) -> Iterator[None]:  # noqa: ANN001 - a pyspark SparkSession
    """The detection job's state store (transformWithState needs RocksDB) for the
    queries started inside, in a test's shared session; its setting restored after."""
    from spark_jobs.spark import session_conf
    from spark_jobs.streaming.job import STATE_STORE

    with session_conf(spark, {"spark.sql.streaming.stateStore.providerClass": STATE_STORE}):
        yield


def wait_port(port: int, proc: subprocess.Popen, what: str = "the server", timeout: float = 240) -> None:
    """Wait until `proc` (e.g. `rulectl connect`) listens on `port` on localhost."""
    import socket

    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, f"{what} exited"
        try:
            socket.create_connection(("127.0.0.1", port), 1).close()
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError(f"{what} never listened on port {port}")


def state_sizes(spark, checkpoint: Path, operator: int) -> dict[str, dict[str, tuple[int, int]]]:  # noqa: ANN001
    """Per key of the job's keyed operator `operator` (its MapState `subs`, read with
    Spark's state data source), per rule id, how many events its sub-state's window and
    its context buffer hold in its own entry. Parsed from the layouts the JVM documents
    (KeyState: a format byte, a part count, per part an int-length id and an int-length
    sub-state; SubState: a format byte, maxTs and expiry as a flag byte and a long, the
    signature as an int-length string, a last-crossing byte, the window (an event count,
    the times, a flag byte and the numbers, a flag byte and int-length texts), then the
    context buffer's row count)."""
    import struct

    spark.streams.active  # noqa: B018 - the store reports to the StateStoreCoordinator its query manager makes
    rows = (spark.read.format("statestore").option("operatorId", operator).option("stateVarName", "subs")
            .load(str(checkpoint / "query")).collect())
    out: dict[str, dict[str, tuple[int, int]]] = {}
    for row in rows:
        # Each a struct of one field (the state variable's encoder: a string, a binary).
        key, value = row["user_map_key"][0], bytes(row["user_map_value"][0])
        if "\x00" in key:  # a sealed chunk's entry
            continue
        assert value[0] == 2, value[:1]
        parts, at = {}, 5
        for _ in range(struct.unpack_from(">i", value, 1)[0]):
            n = struct.unpack_from(">i", value, at)[0]
            rule_id, at = value[at + 4:at + 4 + n].decode(), at + 4 + n
            n = struct.unpack_from(">i", value, at)[0]
            sub, at = value[at + 4:at + 4 + n], at + 4 + n
            pos = 1
            for _ in range(2):  # maxTs, expiry
                pos += 9 if sub[pos] else 1
            sig = struct.unpack_from(">i", sub, pos)[0]
            pos += 4 + max(sig, 0) + 1
            window = struct.unpack_from(">i", sub, pos)[0]
            pos += 4 + 8 * window
            pos += 1 + (8 * window if sub[pos] else 0)
            if sub[pos]:
                pos += 1
                for _ in range(window):
                    pos += 4 + max(struct.unpack_from(">i", sub, pos)[0], 0)
            else:
                pos += 1
            parts[rule_id] = (window, struct.unpack_from(">i", sub, pos)[0])
        out[key] = parts
    return out
