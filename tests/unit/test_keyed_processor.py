"""The bucketed stateful processor (one Python call per (rule, bucket of keys), per-key
state in a MapState, one timer per bucket) against the per-key processor it replaced
(one call, ListState/ValueState and one timer per (rule, key)): the same output for
the same micro-batches and watermarks, expiry included. Driven by pyspark's TwsTester
(in-memory state, Spark's timer rule: fire when expiry <= watermark)."""

from __future__ import annotations

import json
import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark.sql.streaming.tws_tester")

from pyspark.sql import Row as SparkRow  # noqa: E402
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle  # noqa: E402
from pyspark.sql.streaming.tws_tester import TwsTester  # noqa: E402
from pyspark.sql.types import BooleanType, DoubleType, LongType, StringType, StructField, StructType  # noqa: E402

from spark_jobs.engine.conditions import compare_json  # noqa: E402
from spark_jobs.rules.model import CorrelationRule, VelocityRule, parse_rule  # noqa: E402
from spark_jobs.streaming.keyed_logic import (  # noqa: E402
    CorrelationState,
    Row,
    VelocityState,
    _aggregate,
    correlation_step,
    evict_context,
    evict_window,
    velocity_step,
)
from spark_jobs.streaming.processor import DetectionProcessor, _out, _rule  # noqa: E402

# ------------------------------------------------------------------ the per-key reference

_ENTRY = StructType([StructField(n, t) for n, t in [("ts", LongType()), ("seq", LongType()), ("num", DoubleType()),
                                                   ("jv", StringType()), ("raw", StringType()), ("topic", StringType())]])
_META = StructType([StructField("version", StringType()), StructField("signature", StringType()),
                    StructField("prev_above", BooleanType()), StructField("max_ts", LongType()),
                    StructField("timer", LongType())])


def _to_row(r: Any) -> Row:
    return Row(ts=r["ts_ms"], seq=r["seq"], num=r["num"], jv=r["jv"], raw=r["raw"], topic=r["topic"])


class PerKeyProcessor(StatefulProcessor):
    """The previous processor, grouped by (rule_id, key), kept as the reference."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.entries = handle.getListState("entries", _ENTRY)
        self.pending = handle.getListState("pending", _ENTRY)
        self.meta = handle.getValueState("meta", _META)

    def _list(self, state: Any) -> list[Row]:
        return [Row(t[0], t[1], t[2], t[3], t[4] or "", t[5] or "") for t in state.get()] if state.exists() else []

    def _store(self, state: Any, rows: list[Row]) -> None:
        if rows:
            state.put([(e.ts, e.seq, e.num, e.jv, e.raw or None, e.topic or None) for e in rows])
        else:
            state.clear()

    def _schedule(self, meta: dict, at_ms: int) -> None:
        if meta["timer"] != at_ms:
            if meta["timer"] is not None:
                self.handle.deleteTimer(meta["timer"])
            self.handle.registerTimer(at_ms)
            meta["timer"] = at_ms

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[SparkRow]:
        rows = list(rows)
        rule, sig = _rule(rows[0]["rule_json"])
        watermark = timerValues.getCurrentWatermarkInMs()
        v = self.meta.get() if self.meta.exists() else None
        meta = dict(zip(("version", "signature", "prev_above", "max_ts", "timer"), v or (None,) * 5, strict=True))
        if meta["signature"] is not None and meta["signature"] != sig:
            self.entries.clear()
            self.pending.clear()
            meta["prev_above"] = None
        fresh = []
        for r in rows:
            if r["event_time"] and r["role"] != "routed" and watermark > 0 and r["ts_ms"] < watermark:
                yield _out("dead", rule, _to_row(r), reason=f"late event: older than the job watermark ({watermark} ms)")
            else:
                fresh.append(r)
        fresh.sort(key=lambda r: (r["ts_ms"], r["seq"]))
        if isinstance(rule, VelocityRule):
            state = VelocityState(self._list(self.entries), meta["prev_above"])
            new = [_to_row(r) for r in fresh]
            emits = velocity_step(rule, state, new)
            if new:
                meta["max_ts"] = max(meta["max_ts"] or new[-1].ts, max(r.ts for r in new))
            horizon = meta["max_ts"] or 0
            if rule.uses_event_time and watermark > 0:
                horizon = min(horizon, watermark)
            evict_window(state, rule, horizon)
            meta["prev_above"] = state.prev_above
            self._store(self.entries, [Row(e.ts, e.seq, e.num, e.jv) for e in state.window])
            if rule.uses_event_time and meta["max_ts"] is not None:
                self._schedule(meta, meta["max_ts"] + rule.window_ms + int(rule.watermark_delay * 1000))
            for e in emits:
                yield _out("detection" if rule.emit_to_sink else "routed", rule, e.row, e)
        else:
            assert isinstance(rule, CorrelationRule)
            state = CorrelationState(self._list(self.entries), self._list(self.pending))
            primaries = [_to_row(r) for r in fresh if r["role"] != "context"]
            contexts = [_to_row(r) for r in fresh if r["role"] == "context"]
            op, value = rule.condition.operator, rule.condition.value
            emits = correlation_step(rule, state, primaries, contexts, watermark, lambda jv: compare_json(jv, op, value))
            ts_all = [r.ts for r in primaries + contexts]
            if ts_all:
                meta["max_ts"] = max([meta["max_ts"] or ts_all[0], *ts_all])
            if watermark > 0:
                evict_context(state, rule, watermark)
            self._store(self.entries, state.context)
            self._store(self.pending, state.pending)
            if meta["max_ts"] is not None:
                self._schedule(meta, meta["max_ts"] + rule.lookback_ms + int(rule.watermark_delay * 1000))
            for e in emits:
                yield _out("detection", rule, e.row, e)
        meta["version"], meta["signature"] = rule.version, sig
        self.meta.update(tuple(meta[k] for k in ("version", "signature", "prev_above", "max_ts", "timer")))

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[SparkRow]:
        self.entries.clear()
        self.pending.clear()
        self.meta.clear()
        return iter(())


# ------------------------------------------------------------------ the comparison

BASE = 1_767_600_000_000

VELOCITY = [
    {"rule_id": "v_count", "version": "1", "rule_type": "velocity", "source_topic": "t", "group_by": "user",
     "window_size": 10, "window_unit": "seconds", "aggregation_type": "count", "threshold": 3,
     "time_mode": "event_time", "timestamp_field": "ts", "watermark_delay": 2},
    {"rule_id": "v_sum", "version": "1", "rule_type": "velocity", "source_topic": "t", "group_by": "user",
     "window_size": 8, "window_unit": "seconds", "aggregation_type": "sum", "aggregation_field": "amount",
     "threshold": 60, "time_mode": "event_time", "timestamp_field": "ts", "watermark_delay": 2},
    {"rule_id": "v_max", "version": "1", "rule_type": "velocity", "source_topic": "t", "group_by": "user",
     "window_size": 4, "window_unit": "seconds", "aggregation_type": "max", "aggregation_field": "amount",
     "threshold": 50, "time_mode": "event_time", "timestamp_field": "ts", "watermark_delay": 1,
     "emit_mode": "all_events"},
    {"rule_id": "v_distinct", "version": "1", "rule_type": "velocity", "source_topic": "t", "group_by": "user",
     "window_size": 6, "window_unit": "seconds", "aggregation_type": "distinct_count", "aggregation_field": "m",
     "threshold": 2, "time_mode": "event_time", "timestamp_field": "ts", "watermark_delay": 2},
]
CORRELATION = [
    {"rule_id": "c_last", "version": "1", "rule_type": "correlation", "source_topic": "t", "context_topic": "ctx",
     "correlation_key": "pair", "window_size": 5, "window_unit": "seconds", "context_resolution": "last",
     "context_value_field": "rate", "event_value_field": "r", "timestamp_field": "ts", "metric": "ratio_deviation",
     "condition": {"operator": ">", "value": 0.02}, "watermark_delay": 2},
    {"rule_id": "c_z", "version": "1", "rule_type": "correlation", "source_topic": "t", "context_topic": "ctx",
     "correlation_key": "pair", "window_size": 6, "window_unit": "seconds", "context_resolution": "mean_std",
     "context_value_field": "rate", "event_value_field": "r", "timestamp_field": "ts", "metric": "z_score",
     "condition": {"operator": ">", "value": 1}, "min_context_points": 2, "watermark_delay": 2},
]


def _batches(rule: dict, rnd: random.Random, n_batches: int, keys: list[str]) -> list[tuple[int, list[SparkRow]]]:
    """(watermark, rows) per micro-batch: bursts, gaps longer than a window (expiry),
    out-of-order and late rows."""
    rule_json = json.dumps(parse_rule(rule).model_dump(mode="json"))
    corr = rule["rule_type"] == "correlation"
    out, now, seq, max_seen = [], BASE, 0, 0
    for _ in range(n_batches):
        now += rnd.choice([300, 700, 1500, 4000, 9000, 20_000])
        rows = []
        for _ in range(rnd.randrange(0, 12)):
            k = rnd.choice(keys)
            ts = now - rnd.choice([0, 0, 0, 200, 900, 3000, 9000])
            seq += 1
            role = "context" if corr and rnd.random() < 0.4 else "primary"
            num = rnd.choice([1.0, 1.01, 1.05, 1.1]) if corr else float(rnd.choice([5, 20, 40, 65, 70]))
            rows.append(SparkRow(rule_id=rule["rule_id"], k=k, role=role, rule_json=rule_json, event_time=True,
                                 ts_ms=ts, seq=seq, topic="ctx" if role == "context" else "t",
                                 raw=json.dumps({"k": k, "seq": seq}), num=num, jv=json.dumps(f"m{rnd.randrange(4)}")))
        watermark = max(0, max_seen - 2000)  # the batch's watermark: from earlier batches
        max_seen = max([max_seen, *[r["ts_ms"] for r in rows]])
        out.append((watermark, rows))
    return out


def _run(processor: StatefulProcessor, batches: list[tuple[int, list[SparkRow]]], key_of) -> list[Counter]:
    tester = TwsTester(processor, timeMode="EventTime", eventTimeExtractor=lambda r: 1 << 62)
    results = []
    for watermark, rows in batches:
        tester._currentWatermarkMs = watermark  # the batch's watermark; timers fire after its data
        groups: dict[Any, list[SparkRow]] = {}
        for r in rows:
            groups.setdefault(key_of(r), []).append(r)
        got = []
        for key, group in groups.items():
            got += tester.test(key, group)
        got += tester._handleExpiredTimers()
        results.append(Counter(tuple(r) for r in got))
    return results


@pytest.mark.parametrize("rule", VELOCITY + CORRELATION, ids=lambda r: r["rule_id"])
@pytest.mark.parametrize("buckets", [1, 3])
def test_bucketed_processor_equals_the_per_key_processor(rule, buckets):
    rnd = random.Random(f"{rule['rule_id']}-{buckets}")
    keys = [f"u{i}" for i in range(12)]
    batches = _batches(rule, rnd, 150, keys)
    expected = _run(PerKeyProcessor(), batches, lambda r: (r["rule_id"], r["k"]))
    got = _run(DetectionProcessor(), batches, lambda r: (r["rule_id"], hash(r["k"]) % buckets))
    assert got == expected
    assert sum(map(len, expected)) > 0


def test_bucket_state_is_forgotten_when_every_key_expired():
    rule = VELOCITY[0]
    batches = _batches(rule, random.Random(3), 10, ["a", "b"])
    proc = DetectionProcessor()
    tester = TwsTester(proc, timeMode="EventTime", eventTimeExtractor=lambda r: 1 << 62)
    for watermark, rows in batches:
        tester._currentWatermarkMs = watermark
        if rows:
            tester.test(("v_count", 0), rows)
        tester._handleExpiredTimers()
    assert tester.peekMapState("keys", ("v_count", 0))
    tester.setWatermark(BASE + 10**9)
    assert not tester.peekMapState("keys", ("v_count", 0))
    assert tester.peekValueState("bucket", ("v_count", 0)) is None
    assert not list(tester.handle._timers.listTimers(("v_count", 0)))


@pytest.mark.parametrize("seed", range(5))
def test_count_by_bisection_equals_the_window_filter(seed):
    rnd = random.Random(seed)
    rule = parse_rule({**VELOCITY[0], "emit_mode": rnd.choice(["all_events", "last_event"])})
    state = VelocityState([Row(BASE + rnd.randrange(20_000), i) for i in range(rnd.randrange(30))], rnd.choice([None, True]))
    ref = VelocityState(list(state.window), state.prev_above)
    rows = sorted((Row(BASE + rnd.randrange(30_000), 100 + i) for i in range(40)), key=lambda r: (r.ts, r.seq))
    emits = velocity_step(rule, state, rows)
    expected = []
    for row in rows:  # the definition: filter the window at each event
        ref.window.append(row)
        agg = _aggregate("count", [e for e in ref.window if row.ts - rule.window_ms < e.ts <= row.ts])
        above = agg >= float(rule.threshold)
        if above and (rule.emit_mode == "all_events" or not ref.prev_above):
            expected.append((row.seq, agg))
        ref.prev_above = above
    assert [(e.row.seq, e.agg_value) for e in emits] == expected
    assert state.prev_above == ref.prev_above and state.window == ref.window


def test_rows_without_a_timestamp_are_dead_letters_and_touch_no_state():
    rule = VELOCITY[0]
    rule_json = json.dumps(parse_rule(rule).model_dump(mode="json"))

    def row(k: str, ts: int | None, seq: int) -> SparkRow:
        return SparkRow(rule_id="v_count", k=k, role="primary", rule_json=rule_json, event_time=True, ts_ms=ts,
                        seq=seq, topic="t", raw=f'{{"seq": {seq}}}', num=None, jv=None)

    tester = TwsTester(DetectionProcessor(), timeMode="EventTime", eventTimeExtractor=lambda r: 1 << 62)
    got = tester.test(("v_count", 0), [row("a", None, 1), row("b", BASE, 2), row("b", None, 3)])
    dead = sorted((r["seq"], r["reason"]) for r in got if r["kind"] == "dead")
    reason = "missing or unparseable timestamp needed by velocity rule"
    assert dead == [(1, reason), (3, reason)]
    assert set(tester.peekMapState("keys", ("v_count", 0))) == {("b",)}
