"""The demo generator (`rulectl demo`): live mix and replay against a real broker, and
its patterns against the reference evaluator.

Why these checks: the live demo is only useful if (a) records really arrive, as JSON with
current timestamps, keyed so per-key order holds; (b) `--replay` is exactly the demo
history, moved to now, so a live run can be compared with the backtest; and (c) the
background stays quiet while each injected pattern triggers the rule it was built for,
which the reference evaluator (the rule language read literally) can tell without Spark.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from reference_engine import RefEvent, evaluate

from spark_jobs.demo.generator import PATTERN_RULES, LiveMix, produce_records, record_key, replay_records
from spark_jobs.demo.scenarios import demo_history
from spark_jobs.kafka import admin
from spark_jobs.rules.loader import load_rules

ROOT_RULES = "rules"


def _rulectl(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "spark_jobs.cli", *args], capture_output=True, text=True, timeout=timeout
    )


def _parse_ts(value: str) -> datetime:
    assert value.endswith("Z"), value
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    return {p: hi for p, (_lo, hi) in admin.watermarks(bootstrap, topic).items()}


def _records_after(bootstrap: str, topic: str, before: dict[int, int]) -> list[admin.KafkaRecord]:
    return [r for r in admin.read_all(bootstrap, topic) if r.offset >= before.get(r.partition, 0)]


@pytest.mark.kafka
def test_live_mix_reaches_both_topics_as_timestamped_json(kafka_broker) -> None:
    bootstrap = kafka_broker.bootstrap
    before = {t: _end_offsets(bootstrap, t) for t in ("events.raw", "context.raw")}
    started = datetime.now(UTC)
    result = _rulectl(
        "demo", "--bootstrap", bootstrap, "--rate", "300", "--duration", "2", "--seed", "11",
        "--pattern-every", "0.5", "--malformed-every", "0.2",
    )  # fmt: skip
    finished = datetime.now(UTC)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "pattern click_burst" in result.stdout  # patterns are announced on the console

    events = _records_after(bootstrap, "events.raw", before["events.raw"])
    context = _records_after(bootstrap, "context.raw", before["context.raw"])
    # ~600 background events in 2 s (the producer may trail a little), plus patterns.
    assert 450 <= len(events) <= 900, len(events)
    assert context, "no context records (fx_rate / sensor_baseline / user_reputation)"

    malformed = 0
    types: Counter[str] = Counter()
    for rec in events + context:
        try:
            doc = json.loads(rec.value)
        except ValueError:
            malformed += 1
            assert rec.topic == "events.raw" and rec.key is None
            continue
        types[doc["type"]] += 1
        ts = _parse_ts(doc["timestamp"])
        assert started - timedelta(seconds=1) <= ts <= finished + timedelta(seconds=1), doc
        expected_key = record_key(doc)
        assert (rec.key.decode() if rec.key is not None else None) == expected_key, doc
    assert malformed >= 1  # the dead-letter path gets something to show
    assert {"click", "view", "purchase", "post", "transaction", "sensor_reading"} <= set(types)
    assert {"fx_rate", "sensor_baseline", "user_reputation"} <= set(types)


@pytest.mark.kafka
def test_replay_produces_exactly_the_demo_history_shifted_to_now(kafka_broker) -> None:
    bootstrap = kafka_broker.bootstrap
    suffix = uuid.uuid4().hex[:8]
    ev_topic, ctx_topic = f"demo.events.{suffix}", f"demo.context.{suffix}"
    admin.create_topics(bootstrap, {ev_topic: admin.TopicSpec(2), ctx_topic: admin.TopicSpec(2)})
    started = datetime.now(UTC)
    result = _rulectl(
        "demo",
        "--bootstrap",
        bootstrap,
        "--replay",
        "--fast",
        "--events-topic",
        ev_topic,
        "--context-topic",
        ctx_topic,
    )
    assert result.returncode == 0, result.stderr + result.stdout

    ref_events, ref_context = demo_history()
    got_events = [json.loads(r.value) for r in admin.read_all(bootstrap, ev_topic)]
    got_context = [json.loads(r.value) for r in admin.read_all(bootstrap, ctx_topic)]
    assert (len(got_events), len(got_context)) == (len(ref_events), len(ref_context))

    # The same records, every timestamp moved by one shift that lands the history at now.
    def shape(docs: list[dict]) -> list[tuple[timedelta, str]]:
        t0 = min(_parse_ts(d["timestamp"]) for d in docs)
        rest = lambda d: json.dumps({k: v for k, v in d.items() if k != "timestamp"}, sort_keys=True)  # noqa: E731
        return sorted((_parse_ts(d["timestamp"]) - t0, rest(d)) for d in docs)

    assert shape(got_events + got_context) == shape(ref_events + ref_context)
    # demo_history(start) puts its first record 1 s after start, and start is "now" (the
    # generator's own start: its process took up to 5.6 s to get there on a loaded machine).
    got_first = min(_parse_ts(d["timestamp"]) for d in got_events + got_context)
    assert timedelta(0) <= got_first - started < timedelta(seconds=30), (got_first, started)


def test_replay_keeps_each_recordings_order_and_paces_by_event_time() -> None:
    start = datetime(2030, 1, 1, tzinfo=UTC)
    records = replay_records(start)
    ref_events, ref_context = demo_history(start)
    assert [json.loads(r.value) for r in records if r.topic == "events.raw"] == ref_events
    # The GBPUSD rate is recorded after the transaction it judges: replay keeps that.
    assert [json.loads(r.value) for r in records if r.topic == "context.raw"] == ref_context
    offsets = [r.offset for r in records]
    assert offsets == sorted(offsets)
    first = next(r for r in records if r.topic == "events.raw")
    assert first.offset == pytest.approx(1.0)  # the first event is 1 s into the history


class _ListSink:
    def __init__(self) -> None:
        self.sent: list = []

    def send(self, record) -> None:
        self.sent.append(record)

    def poll(self) -> None:
        pass

    def flush(self, timeout: float) -> int:
        return 0


def _generate(rate: float, seed: int, seconds: float, **kw) -> list:
    mix = LiveMix(rate, seed, datetime(2030, 1, 1, tzinfo=UTC), **kw)
    sink = _ListSink()
    produce_records(mix, sink, pace=False, until=seconds)
    return sink.sent


def test_live_mix_is_deterministic_per_seed() -> None:
    a = _generate(50, 3, 30)
    b = _generate(50, 3, 30)
    c = _generate(50, 4, 30)
    assert [(r.topic, r.key, r.value) for r in a] == [(r.topic, r.key, r.value) for r in b]
    assert [r.value for r in a] != [r.value for r in c]
    offsets = [r.offset for r in a]
    assert offsets == sorted(offsets)


@pytest.mark.parametrize("rate", [5, 40, 300])
def test_background_is_quiet_and_every_pattern_fires_its_rule(rate: int) -> None:
    seconds = 75.0  # one full round of the six patterns (every 10 s from 5 s) and margin
    records = _generate(rate, 21, seconds, pattern_every=10.0)
    loaded = load_rules([ROOT_RULES])
    assert not loaded.errors
    events = [RefEvent(r.topic, r.value.decode(), i) for i, r in enumerate(records)]
    detections = evaluate([lr.rule for lr in loaded.rules], events)

    fired: Counter[tuple[str, str | None]] = Counter()
    for d in detections:
        fired[(d.rule_id, json.loads(d.raw).get("scenario"))] += 1
    # Background: only purchase_threshold (any purchase of 20 or more) ever fires.
    assert {rule for rule, scenario in fired if scenario is None} <= {"purchase_threshold"}
    # Patterns: each fires its rule exactly once per injection, and nothing else fires on
    # them (except purchase_threshold on the spree's big purchases).
    injected = Counter(r.note.split(":")[0].removeprefix("pattern ") for r in records if r.note)
    assert set(injected) == set(PATTERN_RULES)
    for pattern, rule in PATTERN_RULES.items():
        assert fired[(rule, pattern)] == injected[pattern], (pattern, fired)
    allowed = {(rule, pattern) for pattern, rule in PATTERN_RULES.items()} | {
        ("purchase_threshold", "purchase_spree")
    }
    assert {k for k in fired if k[1] is not None} <= allowed
