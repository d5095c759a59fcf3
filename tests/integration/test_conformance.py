"""Every conformance vector (tests/conformance/vectors, written by hand from
docs/rule-language.md) through every engine path the product ships: the backtest on a
classic Spark session, the backtest on a Spark Connect server (`rulectl connect`), and
the live detection job reading a real Kafka broker.

All vectors run in one backtest per path and one live job (each vector on its own
topics and rule ids); tests/conformance/vectors.py checks the output. One Connect server
serves the module's remote backtests (the vectors', and the demo's over files and over
the event archive, held equal to a local session's). The live job's
watermark is the newest event time over all vectors, so vectors that run live keep their
times within their rules' watermark_delay of each other."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conformance.vectors import check, format_problems, load_vectors
from detect_harness import DetectJob

from spark_jobs.backtest.inputs import InputSpec
from spark_jobs.backtest.runner import BacktestConfig, HistoryWindow, run_backtest
from spark_jobs.kafka.admin import TopicSpec, create_topics, read_all
from spark_jobs.kafka.broker import EmbeddedBroker, free_port
from spark_jobs.kafka.publisher import publish_rules
from spark_jobs.rules.model import parse_rule

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "tests" / "data" / "demo"
VECTORS = load_vectors()


def _write_inputs(directory: Path, engine: str) -> tuple[Path, list[InputSpec]]:
    rules_dir = directory / "rules"
    rules_dir.mkdir(parents=True)
    inputs: dict[str, list[bytes]] = {}
    for v in VECTORS:
        if not v.runs_on(engine):
            continue
        (rules_dir / f"{v.prefix}.json").write_text(json.dumps(v.rules()))
        for t in ("events.raw", "context.raw"):
            inputs.setdefault(v.topic(t), [])
        for rec in v.records():
            assert rec.value is not None, f"{v.name}: a record without a value cannot be written to a file"
            inputs.setdefault(rec.topic, []).append(rec.value)
    specs = []
    for topic, values in sorted(inputs.items()):
        path = directory / "inputs" / f"{topic}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\n".join(values) + b"\n")
        specs.append(InputSpec(topic, str(path)))
    return rules_dir, specs


def _backtest_output(out: Path) -> tuple[list[str], list[dict]]:
    detections = (out / "detections.jsonl").read_text().splitlines()
    dead = [json.loads(x) for x in (out / "dead_letter.jsonl").read_text().splitlines()]
    return detections, dead


def _run_backtest(spark, directory: Path) -> tuple[list[str], list[dict]]:  # noqa: ANN001
    rules_dir, specs = _write_inputs(directory, "backtest")
    run_backtest(spark, BacktestConfig(rules_dir, specs, directory / "out", time_field="ts"))
    return _backtest_output(directory / "out")


def test_there_are_enough_vectors_and_each_runs_somewhere():
    assert len(VECTORS) >= 40
    for v in VECTORS:
        assert any(v.runs_on(e) for e in ("backtest", "live")), v.name
        assert "expect" in v.doc and v.doc.get("why"), f"{v.name}: a vector says what it expects and why"


@pytest.fixture(scope="module")
def classic_output(spark, tmp_path_factory):
    return _run_backtest(spark, tmp_path_factory.mktemp("conformance_classic"))


def test_backtest_on_a_classic_session(classic_output):
    problems = check(VECTORS, "backtest", *classic_output)
    assert not problems, format_problems(problems)


def test_an_altered_expectation_fails(classic_output):
    """The check can fail: each vector with an expected number, that number moved by
    1%, and each vector with an expected detection, that detection removed, is reported."""
    altered = 0
    for i, v in enumerate(VECTORS):
        if not v.runs_on("backtest"):
            continue
        for d, det in enumerate(v.doc["expect"].get("detections", [])):
            numbers = [k for k, x in det.items() if k != "event" and isinstance(x, int | float) and not isinstance(x, bool)]
            if numbers:
                wrong = copy.deepcopy(v)
                x = wrong.doc["expect"]["detections"][d][numbers[0]]
                wrong.doc["expect"]["detections"][d][numbers[0]] = x * 1.01 + 1
                assert check([wrong], "backtest", *classic_output).get(v.name), (v.name, numbers[0])
                altered += 1
            dropped = copy.deepcopy(v)
            del dropped.doc["expect"]["detections"][d]
            assert check([dropped], "backtest", *classic_output).get(v.name), v.name
            break
        assert VECTORS[i] is v
    assert altered >= 20


def _remote_backtest(remote: str, rules: Path, args: list[str], out: Path) -> None:
    """`rulectl backtest --remote`, as a user runs it."""
    done = subprocess.run([sys.executable, "-m", "spark_jobs.cli", "backtest", "--remote", remote,
                           "--rules", str(rules), *args, "--out", str(out)],
                          capture_output=True, text=True, timeout=900)
    errors = [ln for ln in done.stderr.splitlines() if "\tat " not in ln]
    assert done.returncode == 0, "\n".join(errors)[-3000:]


def test_backtest_on_a_spark_connect_server(connect_server, tmp_path):
    rules_dir, specs = _write_inputs(tmp_path, "backtest")
    inputs = [a for s in specs for a in ("--input", f"{s.topic}={s.path}")]
    _remote_backtest(connect_server, rules_dir, [*inputs, "--time-field", "ts"], tmp_path / "out")
    problems = check(VECTORS, "backtest", *_backtest_output(tmp_path / "out"))
    assert not problems, format_problems(problems)


def _ids(out: Path) -> list[str]:
    return sorted(json.loads(x)["detection_id"] for x in (out / "detections.jsonl").read_text().splitlines())


def test_connect_backtest_of_files_and_of_the_archive_equals_a_local_one(spark, connect_server, tmp_path):
    """The demo's rules over its recording, as files and as the event archive (Delta):
    the server gives the detection ids a local session gives."""
    from test_archive_quality import write_archive

    events = {t: DEMO / f"{t}.jsonl" for t in ("events.raw", "context.raw")}
    run_backtest(spark, BacktestConfig(ROOT / "rules", [InputSpec(t, str(p)) for t, p in events.items()],
                                       tmp_path / "local"))
    table = tmp_path / "archive"
    write_archive(spark, table, {t: p.read_text().splitlines() for t, p in events.items()})
    now = datetime.now(UTC)
    run_backtest(spark, BacktestConfig(ROOT / "rules", [], tmp_path / "local_archive",
                                       history=HistoryWindow(str(table), now - timedelta(hours=1),
                                                             now + timedelta(minutes=1))))
    inputs = [a for t, p in events.items() for a in ("--input", f"{t}={p}")]
    _remote_backtest(connect_server, ROOT / "rules", inputs, tmp_path / "files")
    _remote_backtest(connect_server, ROOT / "rules", ["--history", str(table), "--from", "-1h"], tmp_path / "archive_out")
    assert _ids(tmp_path / "files") == _ids(tmp_path / "local")
    assert _ids(tmp_path / "archive_out") == _ids(tmp_path / "local_archive")
    assert _ids(tmp_path / "local")


@pytest.mark.kafka
def test_live_job_on_a_real_broker(tmp_path):
    """In arrival order, through Spark's Kafka connector; each vector's records are
    produced in three rounds, each consumed before the next, so windows, context and
    held primaries live across micro-batches."""
    live = [v for v in VECTORS if v.runs_on("live")]
    rounds: list[list] = [[], [], []]
    for v in live:
        recs = v.records()
        for i, rec in enumerate(recs):
            rounds[min(2, 3 * i // max(1, len(recs)))].append(rec)
    with EmbeddedBroker(port=free_port()) as broker:
        bs = broker.bootstrap
        topics = {v.topic(t) for v in live for t in ("events.raw", "context.raw")}
        create_topics(bs, {t: TopicSpec(partitions=1) for t in sorted(topics)})
        publish_rules([parse_rule(r) for v in live for r in v.rules()], bs)
        job = DetectJob(bs, tmp_path / "job")
        job.start(timeout=300)
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": bs, "enable.idempotence": True, "linger.ms": 5})
        errors: list[str] = []
        for batch in rounds:
            for rec in batch:
                producer.produce(rec.topic, value=rec.value,
                                 on_delivery=lambda err, _m: errors.append(str(err)) if err else None)
            assert producer.flush(30) == 0 and not errors, errors
            job.batches_after(1, timeout=300)
            job.wait_for(lambda s: s.get("lag") == 0, timeout=300)
        job.batches_after(2, timeout=300)
        detections = [r.value.decode() for r in read_all(bs, "events.processed")]
        dead = [json.loads(r.value) for r in read_all(bs, "events.deadletter")]
        assert job.stop() == 0
    # Spark's default whole-stage code generation (maxFields 100) holds for the widest
    # keyed plan the suite runs: no fused method outgrows the JVM's 64 KB and falls back.
    log = job.log.read_text(errors="replace")
    assert "Failed to compile" not in log and "grows beyond 64 KB" not in log, job.tail_log()
    dead = [d for d in dead if d["topic"].startswith("cv")]
    problems = check(VECTORS, "live", detections, dead)
    assert not problems, format_problems(problems)
