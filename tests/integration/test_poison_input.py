"""Nothing a producer sends can stop the detection job or make it skip data.

A poison corpus (`tests/data/poison/corpus.json`: malformed, extreme and oversized
events; rules that are invalid, out of range, older than the live version or 1 MB) is
produced straight into the source topics and `rules.active` of a running job, between
normal events, on a real Apache Kafka broker with the job in its own process, as an
attacker or a careless producer would. The oracle for the normal events is the backtest
of the same rules over the normal events alone.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from confluent_kafka import Producer
from detect_harness import DetectJob, detections, produce, wait_detections

from spark_jobs.backtest.inputs import InputSpec
from spark_jobs.backtest.runner import BacktestConfig, run_backtest
from spark_jobs.kafka.admin import create_topics, read_all
from spark_jobs.kafka.broker import EmbeddedBroker, free_port
from spark_jobs.kafka.publisher import publish_rules
from spark_jobs.rules.model import parse_rule

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]
CORPUS = json.loads((Path(__file__).resolve().parents[1] / "data" / "poison" / "corpus.json").read_text())


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _materialise(entry: dict, now: str) -> bytes | None:
    """A corpus entry as the bytes to produce (None: a Kafka null value)."""
    if "nest" in entry:
        n = entry["nest"]
        return ('{"a":' * n + "1" + "}" * n).encode()
    if "value_hex" in entry:
        return bytes.fromhex(entry["value_hex"].replace(b"{now}".hex(), now.encode().hex()))
    if entry["value"] is None:
        return None
    text = entry["value"].replace("{now}", now)
    if "pad_bytes" in entry:
        text = text.replace("{pad}", "x" * entry["pad_bytes"])
    return text.encode()


def _produce_raw(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes | None]]) -> None:
    create_topics(bootstrap, [topic])
    p = Producer({"bootstrap.servers": bootstrap, "message.max.bytes": 1_048_576, "enable.idempotence": True})
    errors: list[str] = []
    for key, value in records:
        p.produce(topic, key=key, value=value, on_delivery=lambda err, _m: errors.append(str(err)) if err else None)
    assert p.flush(30) == 0 and not errors, errors


def _normal(start_ms: int, n_users: int, rounds: int, tag: str) -> list[str]:
    """Clicks (3 per user cross the velocity rule) and purchases (every other one above
    100, one a numeric string), in event-time order."""
    out = []
    t = start_ms
    for r in range(rounds):
        for u in range(n_users):
            t += 10
            out.append(json.dumps({"type": "click", "user": f"u{u}", "n": f"{tag}{r}", "ts": _iso(t)}))
        t += 10
        value = "250" if r == 1 else (50 + 100 * (r % 2) * 2)
        out.append(json.dumps({"type": "purchase", "order": f"{tag}{r}", "value": value, "ts": _iso(t)}))
    return out


@pytest.fixture(scope="module")
def poisoned(tmp_path_factory):
    """The job with the live rules, normal events, the whole corpus, more normal events."""
    work = tmp_path_factory.mktemp("poison")
    broker = EmbeddedBroker(port=free_port(), data_dir=work / "kafka").start()
    bs = broker.bootstrap
    publish_rules([parse_rule(r) for r in CORPUS["live_rules"]], bs)
    job = DetectJob(bs, work / "job")
    job.start()
    states: list[str] = []
    watching = threading.Event()

    def watch() -> None:
        while not watching.is_set():
            states.append(job.status().get("state", "?"))
            watching.wait(0.25)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()

    now_ms = int(time.time() * 1000)
    now = _iso(now_ms)
    before = _normal(now_ms - 120_000, 5, 4, "a")
    produce(bs, "events.raw", before)
    # Until a batch has read them and moved the watermark past the epoch, so the corpus
    # (its 1970 event must be late) lands in a later batch. `lag` 0 alone can be a
    # status from before the records were seen, and the status's watermark is a time
    # text, "1970-01-01T00:00:00.000Z" before it moves.
    job.wait_for(lambda s: s.get("lag") == 0 and (s.get("watermark") or "1970") > "1971", timeout=120)
    _produce_raw(bs, "events.raw", [(None, _materialise(e, now)) for e in CORPUS["events"]])
    _produce_raw(bs, "rules.active", [(e["key"].encode(), _materialise(e, now)) for e in CORPUS["rules"]])
    after = _normal(now_ms - 60_000, 5, 4, "b")
    produce(bs, "events.raw", after)
    yield {"broker": broker, "job": job, "states": states, "normal": before + after, "work": work}
    watching.set()
    watcher.join(5)
    if job.proc and job.proc.poll() is None:
        job.stop()
    broker.stop()


def _expected_ids(spark, normal: list[str], tmp: Path) -> set[str]:
    (tmp / "rules").mkdir(parents=True, exist_ok=True)
    for r in CORPUS["live_rules"]:
        (tmp / "rules" / f"{r['rule_id']}.json").write_text(json.dumps(r))
    (tmp / "events.jsonl").write_text("\n".join(normal))
    run_backtest(spark, BacktestConfig(tmp / "rules", [InputSpec("events.raw", str(tmp / "events.jsonl"))], tmp / "bt",
                                       time_field="ts"))
    return {json.loads(x)["detection_id"] for x in (tmp / "bt" / "detections.jsonl").read_text().splitlines()}


def test_normal_events_are_detected_exactly_as_without_the_poison(poisoned, spark, tmp_path):
    bs = poisoned["broker"].bootstrap
    expected = _expected_ids(spark, poisoned["normal"], tmp_path)
    assert len(expected) >= 8  # 5 users cross the velocity rule, 4 purchases above 100
    dets = wait_detections(bs, "events.processed", lambda d: expected <= {x["detection_id"] for x in d}, timeout=180)
    poisoned["job"].wait_for(lambda s: s.get("lag") == 0, timeout=120)
    time.sleep(2)
    dets = detections(bs)
    truncated = [d for d in dets if d.get("truncated")]
    assert {d["detection_id"] for d in dets if not d.get("truncated")} == expected
    # The 1 MB purchase is detected, cut to fit the sink and marked, never a failure.
    assert len(truncated) == 1 and truncated[0]["rule_id"] == "poison_threshold"
    assert truncated[0]["event_bytes"] > 900_000 and len(json.dumps(truncated[0])) < 10_000
    # Values a rule cannot read as a number never fire: 1e400 and "abc".
    assert not [d for d in dets if d.get("value") in ("abc",) or d.get("type") == "purchase" and d.get("value") is None]


def test_every_poison_record_is_dead_lettered_with_its_reason(poisoned):
    bs = poisoned["broker"].bootstrap
    wanted = [e for e in CORPUS["events"] if e["expect"] and e["expect"] != "truncated detection"]

    def reasons(dead: list[dict]) -> list[str]:
        return [d["reason"] for d in dead]

    def all_there(dead: list[dict]) -> bool:
        got = reasons(dead)
        return all(any(e["expect"] in r for r in got) for e in wanted) and sum(
            r.startswith(("invalid rule", "rule version not newer")) for r in got) >= len(CORPUS["rules"])

    dead = wait_detections(bs, "events.deadletter", all_there, timeout=180)
    got = reasons(dead)
    for e in wanted:
        assert any(e["expect"] in r for r in got), f"{e['case']}: no dead letter with {e['expect']!r}"
    rule_letters = [d for d in dead if d.get("topic") == "rules.active"]
    assert len(rule_letters) == len(CORPUS["rules"])
    # Reports of oversized records are cut to fit the topic, with the original's size.
    big = [d for d in rule_letters if d["rule_id"] == "poison_big"]
    assert big and len(big[0]["raw"]) <= 16_384 and "characters" in big[0]["reason"]


def test_the_job_never_leaves_running_and_rules_move_only_forward(poisoned):
    job = poisoned["job"]
    status = job.wait_for(lambda s: s.get("rule_problems", 0) >= len(CORPUS["rules"]), timeout=120)
    assert job.proc.poll() is None
    assert set(poisoned["states"]) <= {"running"}, set(poisoned["states"])
    assert status["rule_versions"] == {"poison_threshold": "2", "poison_velocity": "1"}
    assert status["rule_problems"] == len(CORPUS["rules"])


def test_values_a_rule_cannot_read_are_counted_per_rule_and_reason(poisoned):
    """`"abc"` and `1e400` where a rule compares a number fire nothing, and the status
    says why (the clicks without `value` are not counted: a missing value is no error)."""
    job = poisoned["job"]
    status = job.wait_for(lambda s: s.get("lag") == 0 and s.get("unreadable"), timeout=120)
    counts = status["unreadable"]
    assert counts.get("poison_threshold") == {"value at $['value'] is not a number": 2}, counts


def test_restart_with_the_poison_still_in_the_topics(poisoned, tmp_path):
    """The same checkpoint, and a new one that reads every poison record again."""
    job, bs = poisoned["job"], poisoned["broker"].bootstrap
    job.wait_for(lambda s: s.get("lag") == 0, timeout=120)
    assert job.stop() == 0
    again = job.start()
    assert again["state"] == "running"
    fresh = DetectJob(bs, tmp_path / "fresh", sink="events.processed.fresh", dlq="events.deadletter.fresh")
    status = fresh.start()
    status = fresh.wait_for(lambda s: s.get("lag") == 0 and s.get("rule_problems", 0) >= len(CORPUS["rules"]),
                            timeout=180)
    assert status["state"] == "running"
    assert status["rule_versions"] == {"poison_threshold": "2", "poison_velocity": "1"}
    assert fresh.stop() == 0
    assert read_all(bs, "events.deadletter.fresh")
