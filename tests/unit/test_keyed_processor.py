"""The bucketed pandas processor (one Python call per (key group, bucket of keys), one
input row per (event, key group) naming the group's rules the event enters, the
bucket's keys with each rule's sub-state and its one timer in one state value) against
the per-key Row processor it replaced (one call, ListState/ValueState and one timer per
(rule, key), one row per (event, rule), the velocity window filtered per event by
definition): the same output for the same micro-batches and watermarks, expiry, late
rows and rows without a timestamp included, for one rule and for several rules sharing
a key group (each event entering a random subset of them).

Both are driven by pyspark's TwsTester (in-memory state, Spark's timer rule: fire when
expiry <= watermark). The pandas processor's input is made the way the Python worker
makes it (pyspark's TransformWithStateInPandasSerializer reading an Arrow stream, groups
split over several DataFrames), and its output is read back the way Spark reads it
(pyspark's pandas -> Arrow conversion with OUTPUT_SCHEMA), so nulls are checked too.
"""

from __future__ import annotations

import io
import json
import math
import pickle
import random
import zlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("pyspark.sql.streaming.tws_tester")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pyarrow as pa  # noqa: E402
from pyspark.sql import Row as SparkRow  # noqa: E402
from pyspark.sql.conversion import PandasToArrowConversion  # noqa: E402
from pyspark.sql.pandas.serializers import TransformWithStateInPandasSerializer  # noqa: E402
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle  # noqa: E402
from pyspark.sql.streaming.stateful_processor_util import TransformWithStateInPandasFuncMode  # noqa: E402
from pyspark.sql.streaming.tws_tester import TwsTester  # noqa: E402
from pyspark.sql.types import BooleanType, DoubleType, LongType, StringType, StructField, StructType  # noqa: E402

from spark_jobs.engine.conditions import compare_json  # noqa: E402
from spark_jobs.rules.model import CorrelationRule, VelocityRule, parse_rule  # noqa: E402
from spark_jobs.streaming import keyed_logic  # noqa: E402
from spark_jobs.streaming.keyed_logic import (  # noqa: E402
    CorrelationState,
    Emit,
    Row,
    VelocityState,
    correlation_step,
    evict_context,
    evict_window,
    velocity_step,
)
from spark_jobs.streaming.processor import (  # noqa: E402
    CHAINED_SCHEMA,
    OUTPUT_SCHEMA,
    PASS_GID,
    DetectionProcessor,
    Slot,
    _column,
    _dump_rows,
    _dump_texts,
    _dump_window,
    _frame,
    _load_rows,
    _load_texts,
    _load_window,
    _out,
    _rule,
)

# ------------------------------------------------------------------ the velocity definition


def _aggregate(kind: str, rows: list[Row]) -> float:
    if kind == "count":
        return float(len(rows))
    if kind == "distinct_count":
        return float(len({r.jv for r in rows}))
    values = [r.num for r in rows if r.num is not None]
    if kind == "sum":
        return math.fsum(values)
    if kind == "avg":
        return math.fsum(values) / len(values)
    if kind == "min":
        return min(values)
    return max(values)


def _ref_velocity_step(rule: VelocityRule, window: list[Row], prev_above: bool | None,
                       rows: list[Row]) -> tuple[list[tuple[Row, float]], bool | None]:
    """Each event against its key's window filtered by time: the definition."""
    emits = []
    for row in rows:
        newest = max((e.ts for e in window), default=None)
        if newest is None or newest <= row.ts - rule.window_ms:
            prev_above = None  # the key's window had emptied: a new episode
        window.append(row)
        agg = _aggregate(rule.aggregation_type, [e for e in window if row.ts - rule.window_ms < e.ts <= row.ts])
        above = agg >= float(rule.threshold)
        if above and (rule.emit_mode == "all_events" or not prev_above):
            emits.append((row, agg))
        prev_above = above
    return emits, prev_above


def _ref_evict(window: list[Row], rule: VelocityRule, horizon_ms: int) -> list[Row]:
    return [e for e in window if e.ts > horizon_ms - rule.window_ms]


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

    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[tuple]:
        rows = list(rows)
        rule, sig = _rule(rows[0]["rule_json"])
        watermark = timerValues.getCurrentWatermarkInMs()
        fresh = []
        for r in rows:
            if r["ts_ms"] is None:
                yield _out("dead", rule, _to_row(r),
                           reason=f"missing or unparseable timestamp needed by {rule.rule_type} rule")
            elif r["event_time"] and r["role"] != "routed" and watermark > 0 and r["ts_ms"] < watermark:
                yield _out("dead", rule, _to_row(r), reason=f"late event: older than the job watermark ({watermark} ms)")
            else:
                fresh.append(r)
        if all(r["ts_ms"] is None for r in rows):
            return  # such rows never touch state
        v = self.meta.get() if self.meta.exists() else None
        meta = dict(zip(("version", "signature", "prev_above", "max_ts", "timer"), v or (None,) * 5, strict=True))
        if meta["signature"] is not None and meta["signature"] != sig:
            self.entries.clear()
            self.pending.clear()
            meta["prev_above"] = None
        fresh.sort(key=lambda r: (r["ts_ms"], r["seq"]))
        if isinstance(rule, VelocityRule):
            window = self._list(self.entries)
            new = [_to_row(r) for r in fresh]
            emits, meta["prev_above"] = _ref_velocity_step(rule, window, meta["prev_above"], new)
            if new:
                meta["max_ts"] = max(meta["max_ts"] or new[-1].ts, max(r.ts for r in new))
            horizon = meta["max_ts"] or 0
            if rule.uses_event_time and watermark > 0:
                horizon = min(horizon, watermark)
            window = _ref_evict(window, rule, horizon)
            self._store(self.entries, [Row(e.ts, e.seq, e.num, e.jv) for e in window])
            if rule.uses_event_time and meta["max_ts"] is not None:
                self._schedule(meta, meta["max_ts"] + rule.window_ms + int(rule.watermark_delay * 1000))
            kind = "detection" if rule.emit_to_sink else "routed"
            for row, agg in emits:
                yield _out(kind, rule, row, Emit(row, agg_value=agg))
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

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[tuple]:
        self.entries.clear()
        self.pending.clear()
        self.meta.clear()
        return iter(())


# ------------------------------------------------------------------ Spark's way in and out

# The operator's input as job.py builds it (grouped by key group and bucket): the
# columns every row has; then t<s>, a<s>, n<s>, j<s> per slot here (compiled.key_rows
# has one per distinct path; each slot its own is the general case for the processor).
_ROW_FIELDS = [("gid", pa.string()), ("k", pa.string()), ("m", pa.string()), ("topic", pa.string()),
               ("seq", pa.int64()), ("raw", pa.string()), ("proc_ms", pa.int64())]
GID = "$['user']"


def _slots_of(rows: list[dict]) -> list[Slot]:
    """One slot per (rule, role, time mode) of per-(event, rule) rows, in first-seen order."""
    seen: dict[tuple, Slot] = {}
    for r in rows:
        sk = (r["rule_json"], r["role"], r["event_time"])
        if sk not in seen:
            s = len(seen)
            seen[sk] = Slot(None, r["rule_json"], r["role"], r["event_time"], f"t{s}", f"a{s}", f"n{s}", f"j{s}")
    return list(seen.values())


def _grouped(rows: list[dict], slots: list[Slot]) -> list[dict]:
    """Per-(event, rule) rows (the previous operator's input) -> one row per event (its
    `seq`): the event once, `m` the slots of its rules, each slot's values in its columns."""
    index = {(s.rule_json, s.role, s.event_time): n for n, s in enumerate(slots)}
    out: dict[int, dict] = {}
    for r in rows:
        n = index[(r["rule_json"], r["role"], r["event_time"])]
        row = out.get(r["seq"])
        if row is None:
            row = out[r["seq"]] = {"gid": GID, "k": r["k"], "m": str(n), "topic": r["topic"], "seq": r["seq"],
                                   "raw": r["raw"], "proc_ms": None}
        else:
            assert (row["k"], row["topic"], row["raw"]) == (r["k"], r["topic"], r["raw"])
            row["m"] += f",{n}"
        row.update({f"t{n}": r["ts_ms"], f"a{n}": r.get("ts_issue"), f"n{n}": r["num"], f"j{n}": r["jv"]})
    return list(out.values())


def _in_schema(slots: list[Slot]) -> pa.Schema:
    fields = list(_ROW_FIELDS)
    for n in range(len(slots)):
        fields += [(f"t{n}", pa.int64()), (f"a{n}", pa.string()), (f"n{n}", pa.float64()), (f"j{n}", pa.string())]
    return pa.schema([*fields, ("bucket", pa.int32())])


def _worker_groups(rows: list[dict], slots: list[Slot],
                   max_records: int) -> Iterator[tuple[Any, Iterator[pd.DataFrame]]]:
    """The micro-batch's rows as the Python worker hands them to transformWithStateInPandas:
    one Arrow batch sorted by the grouping key, read by pyspark's serializer into
    per-group DataFrames of at most `max_records` rows."""
    schema = _in_schema(slots)
    rows = sorted(rows, key=lambda r: (r["gid"], r["bucket"]))
    buf = io.BytesIO()
    with pa.ipc.new_stream(buf, schema) as w:
        w.write_batch(pa.RecordBatch.from_pylist(rows, schema=schema))
    buf.seek(0)
    ser = TransformWithStateInPandasSerializer(
        timezone="UTC", safecheck=True, assign_cols_by_name=True, prefer_int_ext_dtype=False,
        arrow_max_records_per_batch=max_records, arrow_max_bytes_per_batch=2**31 - 1,
        int_to_decimal_coercion_enabled=False,
    )
    ser.key_offsets = [schema.names.index("gid"), schema.names.index("bucket")]
    for mode, key, group in ser.load_stream(buf):
        if mode == TransformWithStateInPandasFuncMode.PROCESS_DATA:
            yield key, (df for _, df in group)


def _in_frame(rows: list[dict], slots: list[Slot]) -> pd.DataFrame:
    """Per-(event, rule) rows as one operator input frame (as pandas has it)."""
    return pd.DataFrame(_grouped(rows, slots))


def _spark_reads(frames: Any) -> list[tuple]:
    """Output DataFrames as the JVM receives them (pandas -> Arrow with OUTPUT_SCHEMA)."""
    if isinstance(frames, pd.DataFrame):
        frames = [frames]
    out = []
    for df in frames:
        if len(df.columns) == 0:
            continue
        batch = PandasToArrowConversion.convert(df, OUTPUT_SCHEMA, timezone="UTC", safecheck=True, arrow_cast=True,
                                                assign_cols_by_name=True)
        out += [tuple(d.values()) for d in batch.to_pylist()]
    return out


# ------------------------------------------------------------------ the comparison

BASE = 1_767_600_000_000

VELOCITY = [
    {"rule_id": "v_count", "version": "1", "rule_type": "velocity", "source_topic": "t", "group_by": "user",
     "window_size": 10, "window_unit": "seconds", "aggregation_type": "count", "threshold": 3,
     "time_mode": "event_time", "timestamp_field": "ts", "watermark_delay": 2},
    {"rule_id": "v_sum", "version": "1", "rule_type": "velocity", "source_topic": "t", "group_by": "user",
     "window_size": 8, "window_unit": "seconds", "aggregation_type": "sum", "aggregation_field": "amount",
     "threshold": 60, "time_mode": "event_time", "timestamp_field": "ts", "watermark_delay": 2},
    {"rule_id": "v_avg", "version": "1", "rule_type": "velocity", "source_topic": "t", "group_by": "user",
     "window_size": 8, "window_unit": "seconds", "aggregation_type": "avg", "aggregation_field": "amount",
     "threshold": 41.3, "time_mode": "event_time", "timestamp_field": "ts", "watermark_delay": 2,
     "emit_mode": "all_events"},
    {"rule_id": "v_max", "version": "1", "rule_type": "velocity", "source_topic": "t", "group_by": "user",
     "window_size": 4, "window_unit": "seconds", "aggregation_type": "max", "aggregation_field": "amount",
     "threshold": 50, "time_mode": "event_time", "timestamp_field": "ts", "watermark_delay": 1,
     "emit_mode": "all_events"},
    {"rule_id": "v_min", "version": "1", "rule_type": "velocity", "source_topic": "t", "group_by": "user",
     "window_size": 5, "window_unit": "seconds", "aggregation_type": "min", "aggregation_field": "amount",
     "threshold": 20, "time_mode": "event_time", "timestamp_field": "ts", "watermark_delay": 1},
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


def _batches(rules: list[dict], rnd: random.Random, n_batches: int, keys: list[str]) -> list[tuple[int, list[dict]]]:
    """(watermark, per-(event, rule) rows) per micro-batch: bursts, gaps longer than a
    window (expiry), out-of-order, late rows and rows without a timestamp. With several
    rules, each event enters a random subset of them (same key, time and text)."""
    rule_json = {r["rule_id"]: json.dumps(parse_rule(r).model_dump(mode="json")) for r in rules}
    corr = any(r["rule_type"] == "correlation" for r in rules)
    out, now, seq, max_seen = [], BASE, 0, 0
    for _ in range(n_batches):
        now += rnd.choice([300, 700, 1500, 4000, 9000, 20_000])
        rows = []
        for _ in range(rnd.randrange(0, 12)):
            k = rnd.choice(keys)
            ts = now - rnd.choice([0, 0, 0, 200, 900, 3000, 9000])
            seq += 1
            role = "context" if corr and rnd.random() < 0.4 else "primary"
            chosen = rules if len(rules) == 1 else [r for r in rules if rnd.random() < 0.6] or [rnd.choice(rules)]
            nums = [rnd.choice([1.0, 1.01, 1.05, 1.1]) if r["rule_type"] == "correlation"
                    else rnd.choice([5.0, 20.0, 40.0, 65.0, 70.0, 0.1, 1e16, -1e16]) for r in chosen]
            ts_ms = None if rnd.random() < 0.03 else ts
            for r, num in zip(chosen, nums, strict=True):
                r_role = role if r["rule_type"] == "correlation" else "primary"
                rows.append(dict(rule_id=r["rule_id"], k=k, role=r_role, rule_json=rule_json[r["rule_id"]],
                                 event_time=True, ts_ms=ts_ms, seq=seq, topic="ctx" if role == "context" else "t",
                                 raw=json.dumps({"k": k, "seq": seq}), num=num, jv=json.dumps(f"m{rnd.randrange(4)}")))
        watermark = max(0, max_seen - 2000)  # the batch's watermark: from earlier batches
        max_seen = max([max_seen, *[r["ts_ms"] for r in rows if r["ts_ms"] is not None]])
        out.append((watermark, rows))
    return out


def _run_reference(batches: list[tuple[int, list[dict]]]) -> list[Counter]:
    tester = TwsTester(PerKeyProcessor(), timeMode="EventTime", eventTimeExtractor=lambda r: 1 << 62)
    results = []
    for watermark, rows in batches:
        tester._currentWatermarkMs = watermark  # the batch's watermark; timers fire after its data
        groups: dict[Any, list[SparkRow]] = {}
        for r in rows:
            groups.setdefault((r["rule_id"], r["k"]), []).append(SparkRow(**r))
        got = []
        for key, group in groups.items():
            got += tester.test(key, group)
        got += tester._handleExpiredTimers()
        results.append(Counter(got))
    return results


def _run_pandas(batches: list[tuple[int, list[dict]]], buckets: int, max_records: int) -> list[Counter]:
    slots = _slots_of([r for _, rows in batches for r in rows])
    proc = DetectionProcessor(slots)
    tester = TwsTester(proc, timeMode="EventTime", eventTimeExtractor=lambda r: 1 << 62)
    results = []
    for watermark, rows in batches:
        tester._currentWatermarkMs = watermark
        got = []
        if rows:
            # Deterministic bucketing (crc32, not Python's salted hash()): a failure replays.
            bucketed = [{**r, "bucket": zlib.crc32(r["k"].encode()) % buckets} for r in _grouped(rows, slots)]
            for key, frames in _worker_groups(bucketed, slots, max_records):
                tester.handle.setGroupingKey(key)
                got += _spark_reads(proc.handleInputRows(key, frames, tester._getTimerValues()))
        got += _spark_reads(tester._handleExpiredTimers())
        results.append(Counter(got))
    return results


RULE_SETS = [[r] for r in VELOCITY + CORRELATION] + [VELOCITY, VELOCITY + CORRELATION]


@pytest.mark.parametrize("rules", RULE_SETS, ids=lambda rs: rs[0]["rule_id"] if len(rs) == 1 else f"{len(rs)}_rules")
@pytest.mark.parametrize(("buckets", "max_records"), [(1, 10_000), (3, 10_000), (2, 3)])
def test_bucketed_processor_equals_the_per_key_processor(rules, buckets, max_records):
    name = rules[0]["rule_id"] if len(rules) == 1 else "+".join(r["rule_id"] for r in rules)
    rnd = random.Random(f"{name}-{buckets}")
    keys = [f"u{i}" for i in range(12)]
    batches = _batches(rules, rnd, 150, keys)
    expected = _run_reference(batches)
    got = _run_pandas(batches, buckets, max_records)
    assert got == expected
    assert sum(n for c in expected for k, n in c.items() if k[0] != "dead") > 0
    assert any(k[0] == "dead" and k[7] is None for c in expected for k in c)  # no timestamp
    assert any(k[0] == "dead" and k[7] is not None for c in expected for k in c)  # late
    if len(rules) > 1:  # every rule of the group fired or dead-lettered something
        assert {k[1] for c in expected for k in c} == {r["rule_id"] for r in rules}
        assert sum(len(rows) for _, rows in batches) > len({r["seq"] for _, rows in batches for r in rows})


def _bucket_keys(tester: TwsTester, key: tuple) -> dict:
    """{key: {rule_id: sub-state}} of a bucket."""
    v = tester.peekValueState("bucket", key)
    return pickle.loads(v[1]) if v and v[1] else {}


def test_bucket_state_is_forgotten_when_every_key_expired():
    rule = VELOCITY[0]
    batches = _batches([rule], random.Random(3), 10, ["a", "b"])
    slots = _slots_of([r for _, rows in batches for r in rows])
    proc = DetectionProcessor(slots)
    tester = TwsTester(proc, timeMode="EventTime", eventTimeExtractor=lambda r: 1 << 62)
    for watermark, rows in batches:
        tester._currentWatermarkMs = watermark
        if rows:
            tester.testInPandas((GID, 0), _in_frame(rows, slots))
        tester._handleExpiredTimers()
    assert _bucket_keys(tester, (GID, 0))
    assert {rid for subs in _bucket_keys(tester, (GID, 0)).values() for rid in subs} == {"v_count"}
    tester.setWatermark(BASE + 10**9)
    assert tester.peekValueState("bucket", (GID, 0)) is None
    assert not list(tester.handle._timers.listTimers((GID, 0)))


@pytest.mark.parametrize("time_mode", ["processing_time", "event_time"])
def test_state_goes_back_down_when_short_lived_keys_come_and_go(time_mode):
    """200k distinct keys, each seen once, 2,000 a batch, time moving 10 s a batch with a
    5 s window: the bucket's state (keys and bytes) rises with the first batches and
    stays flat after, instead of growing with every key ever seen."""
    rule = {"rule_id": "v_short", "version": "1", "rule_type": "velocity", "source_topic": "t", "group_by": "user",
            "window_size": 5, "window_unit": "seconds", "aggregation_type": "count", "threshold": 3,
            "time_mode": time_mode, "watermark_delay": 1}
    if time_mode == "event_time":
        rule["timestamp_field"] = "ts"
    rule_json = json.dumps(parse_rule(rule).model_dump(mode="json"))
    slots = [Slot(None, rule_json, "source", time_mode == "event_time", "t0", "a0", "n0", "j0")]
    tester = TwsTester(DetectionProcessor(slots), timeMode="EventTime", eventTimeExtractor=lambda r: 1 << 62)
    key = (GID, 0)
    sizes = []
    for b in range(100):
        now = BASE + b * 10_000
        tester._currentWatermarkMs = max(0, now - 10_000 - 1_000) if time_mode == "event_time" else 0
        rows = [dict(rule_id="v_short", k=f'"k{b}-{i}"', role="source", rule_json=rule_json,
                     event_time=time_mode == "event_time", ts_ms=now + i, seq=b * 10_000 + i, topic="t",
                     raw="{}", num=None, jv=None) for i in range(2_000)]
        tester.testInPandas(key, _in_frame(rows, slots))
        tester._handleExpiredTimers()
        v = tester.peekValueState("bucket", key)
        sizes.append((len(_bucket_keys(tester, key)), len(v[1]) if v and v[1] else 0))
    most_keys = max(n for n, _ in sizes)
    assert most_keys < 10_000, sizes[:5]  # never more than the keys of the last batches
    assert sizes[-1][0] <= 4_000 and sizes[-1][1] <= 2 * sizes[3][1], sizes[-5:]


def test_rows_without_a_timestamp_are_dead_letters_and_touch_no_state():
    rule = VELOCITY[0]
    rule_json = json.dumps(parse_rule(rule).model_dump(mode="json"))

    def row(k: str, ts: int | None, seq: int) -> dict:
        return dict(rule_id="v_count", k=k, role="primary", rule_json=rule_json, event_time=True, ts_ms=ts,
                    seq=seq, topic="t", raw=f'{{"seq": {seq}}}', num=None, jv=None)

    rows = [row("a", None, 1), row("b", BASE, 2), row("b", None, 3)]
    slots = _slots_of(rows)
    tester = TwsTester(DetectionProcessor(slots), timeMode="EventTime", eventTimeExtractor=lambda r: 1 << 62)
    # As pandas has it: t0 float64 with NaN for the nulls, n0 all NaN, j0 and a0 all None.
    got = _spark_reads(tester.testInPandas((GID, 0), _in_frame(rows, slots)))
    names = OUTPUT_SCHEMA.names
    dead = sorted((r[names.index("seq")], r[names.index("ts_ms")], r[names.index("reason")])
                  for r in got if r[0] == "dead")
    reason = "missing or unparseable timestamp needed by velocity rule"
    assert dead == [(1, None, reason), (3, None, reason)]
    assert set(_bucket_keys(tester, (GID, 0))) == {"b"}


def test_a_time_too_far_ahead_is_a_dead_letter_with_its_reason():
    """A time the plan marked unusable (`a<i>`: too far ahead of the broker time) is
    no time: that rule's row is a dead letter with the plan's reason, and another rule
    of the same event (with a usable time in its own column) still counts it."""
    issue = "event time more than 5000 ms ahead of the record's broker timestamp"
    rj = json.dumps(parse_rule(VELOCITY[0]).model_dump(mode="json"))
    rj2 = json.dumps(parse_rule({**VELOCITY[0], "rule_id": "v_count2", "threshold": 1}).model_dump(mode="json"))
    rows = [dict(rule_id="v_count", k="a", role="source", rule_json=rj, event_time=True, ts_ms=BASE + 10**9,
                 seq=1, topic="t", raw="{}", num=None, jv=None, ts_issue=issue),
            dict(rule_id="v_count2", k="a", role="source", rule_json=rj2, event_time=True, ts_ms=BASE,
                 seq=1, topic="t", raw="{}", num=None, jv=None)]
    slots = _slots_of(rows)
    tester = TwsTester(DetectionProcessor(slots), timeMode="EventTime", eventTimeExtractor=lambda r: 1 << 62)
    got = _spark_reads(tester.testInPandas((GID, 0), _in_frame(rows, slots)))
    names = OUTPUT_SCHEMA.names
    assert sorted((r[0], r[1], r[names.index("ts_ms")], r[names.index("reason")]) for r in got) == [
        ("dead", "v_count", None, issue), ("detection", "v_count2", BASE, None)]
    assert _bucket_keys(tester, (GID, 0)).keys() == {"a"}
    assert set(_bucket_keys(tester, (GID, 0))["a"]) == {"v_count2"}


def test_an_event_far_in_the_past_does_not_fail_the_batch():
    """Before the watermark moves (0), an event from 1938 gives its key an expiry below
    it; Spark refuses a timer there, which failed the batch (found by the event fuzz
    test). The key is kept and forgotten when the watermark moves."""
    rule = VELOCITY[0]
    rule_json = json.dumps(parse_rule(rule).model_dump(mode="json"))
    rows = [dict(rule_id="v_count", k="old", role="primary", rule_json=rule_json, event_time=True,
                 ts_ms=-1_000_000_000_000, seq=1, topic="t", raw='{"seq": 1}', num=None, jv=None)]
    slots = _slots_of(rows)
    tester = TwsTester(DetectionProcessor(slots), timeMode="EventTime", eventTimeExtractor=lambda r: 1 << 62)
    tester.testInPandas((GID, 0), _in_frame(rows, slots))
    assert set(_bucket_keys(tester, (GID, 0))) == {"old"}
    tester._currentWatermarkMs = 5
    tester._handleExpiredTimers()
    assert _bucket_keys(tester, (GID, 0)) == {}


def test_a_key_whose_evaluation_fails_is_dead_lettered_and_the_batch_goes_on(monkeypatch):
    """A bug or an unforeseen value in one key's evaluation must not fail the batch (it
    would fail again on every restart): that key's rows are dead letters with the
    error, its state is left as it was, every other key is evaluated."""
    from spark_jobs.streaming import processor as processor_module

    rule = VELOCITY[0]
    rule_json = json.dumps(parse_rule(rule).model_dump(mode="json"))
    real_step = processor_module.velocity_step

    def exploding_step(*args: Any, **kwargs: Any) -> Any:
        if any(isinstance(a, list) and any(getattr(r, "num", None) == 13.0 for r in a) for a in args):
            raise ArithmeticError("boom")
        return real_step(*args, **kwargs)

    monkeypatch.setattr(processor_module, "velocity_step", exploding_step)

    def row(k: str, seq: int, num: float) -> dict:
        return dict(rule_id="v_count", k=k, role="primary", rule_json=rule_json, event_time=True, ts_ms=BASE + seq,
                    seq=seq, topic="t", raw=f'{{"seq": {seq}}}', num=num, jv=None)

    rows = [row("good", 1, 1.0), row("bad", 2, 13.0), row("bad", 3, 1.0), row("good", 4, 1.0)]
    slots = _slots_of(rows)
    tester = TwsTester(DetectionProcessor(slots), timeMode="EventTime", eventTimeExtractor=lambda r: 1 << 62)
    got = _spark_reads(tester.testInPandas((GID, 0), _in_frame(rows, slots)))
    names = OUTPUT_SCHEMA.names
    dead = sorted((r[names.index("seq")], r[names.index("reason")]) for r in got if r[0] == "dead")
    assert dead == [(2, "rule evaluation failed: ArithmeticError: boom"), (3, "rule evaluation failed: ArithmeticError: boom")]
    assert set(_bucket_keys(tester, (GID, 0))) == {"good"}


# ------------------------------------------------------------------ velocity_step by definition

KINDS = ["count", "sum", "avg", "min", "max", "distinct_count"]


def _outcome(f: Any, *args: Any) -> Any:
    try:
        return f(*args)
    except (ValueError, ZeroDivisionError, OverflowError) as e:
        return type(e).__name__


@pytest.mark.parametrize(("kind", "slide_from"), [("count", 0)] + [(k, x) for k in KINDS[1:] for x in (0, 10**9)])
@pytest.mark.parametrize("seed", range(6))
def test_velocity_step_equals_the_window_filter(kind, slide_from, seed, monkeypatch):
    """Bisection over the sorted window gives what filtering it per event gives, exact
    sums included (values that cancel, big and small), across batches whose rows fall
    before, among and after the stored ones, with eviction between batches; by slices
    per event and by sliding ranges / reduceat (slide_from=0, the path for many values)."""
    monkeypatch.setattr(keyed_logic, "_SLIDE_FROM", slide_from)
    rnd = random.Random(f"{kind}-{seed}")
    spec = {**VELOCITY[0], "aggregation_type": kind, "window_size": rnd.choice([1, 3, 10]),
            "threshold": rnd.choice([2, 50, 100.5]), "emit_mode": rnd.choice(["all_events", "last_event"])}
    if kind != "count":
        spec["aggregation_field"] = "a"
    rule = parse_rule(spec)
    values = [0.1, 0.2, 0.3, 1.0, 7.0, 3.3333, 2.5e-8, 1e16, -1e16, 123456.789]
    with_none = kind in ("count", "distinct_count") or seed == 5
    prev = rnd.choice([None, True, False])
    window: list[Row] = []
    state = VelocityState.of([], prev)
    seq = 0
    for _ in range(6):
        rows = []
        for _ in range(rnd.choice([0, 1, 5, 40, 150])):
            seq += 1
            num = None if with_none and rnd.random() < 0.2 else rnd.choice(values)
            rows.append(Row(BASE + rnd.randrange(30_000), seq, num, rnd.choice(['"a"', '"b"', "1", None])))
        rows.sort(key=lambda r: (r.ts, r.seq))
        expected = _outcome(_ref_velocity_step, rule, window, prev, rows)
        got = _outcome(velocity_step, rule, state, rows)
        if isinstance(expected, str):
            assert got == expected
            return
        emits, prev = expected
        assert [(e.row.seq, e.agg_value) for e in got] == [(r.seq, agg) for r, agg in emits]
        assert state.prev_above == prev
        horizon = BASE + rnd.randrange(30_000)
        window = _ref_evict(window, rule, horizon)
        evict_window(state, rule, horizon)
        key = lambda e: (e[0], -1.0 if e[1] is None else e[1], str(e[2]))  # noqa: E731
        assert sorted(state.entries(), key=key) == sorted(((e.ts, e.num, e.jv) for e in window), key=key)
        assert state.ts == sorted(state.ts)


@pytest.mark.parametrize("values", [[1e308, 1e308, -1e308], [float("inf"), 1.0], [float("inf"), float("-inf")],
                                    [1e300, 3.0, -1e300], [1e299, 3.0, -1e299]])
@pytest.mark.parametrize("slide_from", [0, 10**9])
def test_window_sums_of_huge_values_are_the_definition(values, slide_from, monkeypatch):
    monkeypatch.setattr(keyed_logic, "_SLIDE_FROM", slide_from)
    rule = parse_rule({**VELOCITY[1], "threshold": 0})
    rows = [Row(BASE + i, i, v) for i, v in enumerate(values)]
    expected = _outcome(lambda: [agg for _, agg in _ref_velocity_step(rule, [], None, rows)[0]])
    got = _outcome(lambda: [e.agg_value for e in velocity_step(rule, VelocityState(), rows)])
    assert repr(got) == repr(expected)


def test_velocity_step_needs_rows_sorted_by_time():
    with pytest.raises(ValueError, match="sorted"):
        velocity_step(parse_rule(VELOCITY[0]), VelocityState(), [Row(BASE + 1, 1), Row(BASE, 2)])


# ------------------------------------------------------------------ stored forms, columns, output


@pytest.mark.parametrize("texts", [['"a"', "1", '{"x": [1, 2]}'], [""], ["", ""], ['"é\\u0000"', "null"],
                                   ['"a"', None], ["a\x00b", "c"], [None], [None, None]])
def test_texts_round_trip(texts):
    assert _load_texts(_dump_texts(texts), len(texts)) == texts
    assert _load_texts(bytearray(_dump_texts(texts)), len(texts)) == texts  # as the state server may hand it back


@pytest.mark.parametrize("rows", [
    [Row(BASE, 1, 1.5, '"a"', '{"k": 1}', "ctx"), Row(BASE + 1, 2, None, None, "", "")],
    [Row(BASE, 1, None, None, "{}", "t")],
    [Row(BASE, 1, float("inf"), "1", "a\x00b", "t"), Row(BASE - 5, 9, -0.5, '"é"', "{}", "t")],
    [Row(None, 1, 2.0, None, "{}", "t")],  # type: ignore[arg-type]
])
def test_buffer_rows_round_trip(rows):
    for b in (_dump_rows(rows), bytearray(_dump_rows(rows) or b"")):
        assert _load_rows(b) == rows
    assert _dump_rows([]) is None and _load_rows(None) == []


@pytest.mark.parametrize("kind", KINDS)
def test_window_round_trip(kind):
    state = VelocityState.of([Row(BASE + 5, 1, 2.5, '"a"'), Row(BASE, 2, None, None), Row(BASE + 5, 3, -1.0, "7")], True)
    t, n, j = _dump_window(state, kind)
    back = _load_window(*(bytearray(x) if x is not None else None for x in (t, n, j)), True)
    assert back.ts == state.ts and back.prev_above is True
    if kind in ("sum", "avg", "min", "max"):
        assert [x for _, x, _ in back.entries()] == [x for _, x, _ in state.entries()]
    if kind == "distinct_count":
        assert back.jv == state.jv
    assert _dump_window(VelocityState(), kind) == (None, None, None)
    assert _load_window(None, None, None, None).ts == []


def test_columns_come_back_with_nulls_and_python_types():
    assert _column(pd.Series([1.0, np.nan, 3.0]), "int") == [1, None, 3]
    assert all(type(v) is int for v in _column(pd.Series([1.0, 2.0]), "int"))
    assert _column(pd.Series([1, None, 3], dtype="Int64"), "int") == [1, None, 3]
    assert _column(pd.Series([1.5, np.nan]), "float") == [1.5, None]
    assert _column(pd.Series(["a", None, np.nan], dtype=object), "obj") == ["a", None, None]
    assert _column(pd.Series([True, None], dtype=object), "obj") == [True, None]
    assert _column(pd.Series([True, False]), "obj") == [True, False]


def test_output_frame_gives_spark_nulls_not_nans():
    rule, _ = _rule(json.dumps(parse_rule(VELOCITY[0]).model_dump(mode="json")))
    rows = [_out("dead", rule, Row(None, 7, raw="{}", topic="t"), reason="x"),  # type: ignore[arg-type]
            _out("detection", rule, Row(BASE, 8, raw="{}", topic="t"), Emit(Row(BASE, 8), agg_value=3.0))]
    assert _spark_reads(_frame(rows)) == rows
    assert _spark_reads(_frame(rows))[0][OUTPUT_SCHEMA.names.index("ts_ms")] is None


def _arrow_reads(frames: Any, schema: StructType) -> list[tuple]:
    """Output DataFrames as the JVM receives them under `schema`."""
    out = []
    for df in frames:
        batch = PandasToArrowConversion.convert(df, schema, timezone="UTC", safecheck=True, arrow_cast=True,
                                                assign_cols_by_name=True)
        out += [tuple(d.values()) for d in batch.to_pylist()]
    return out


def test_a_chained_operator_stamps_every_row_after_its_watermark():
    """Spark refuses a chained operator's row whose event time (`et`) is not after the
    operator's watermark (EMITTING_ROWS_OLDER_THAN_WATERMARK_NOT_ALLOWED); `et` is the
    row's event time or the watermark + 1 ms, and the row's own time stays in ts_ms."""
    rule = VELOCITY[0]
    rule_json = json.dumps(parse_rule(rule).model_dump(mode="json"))
    watermark = BASE + 5_000

    def row(ts: int | None, seq: int) -> dict:
        return dict(rule_id="v_count", k="a", role="primary", rule_json=rule_json, event_time=True, ts_ms=ts,
                    seq=seq, topic="t", raw=f'{{"seq": {seq}}}', num=None, jv=None)

    # A late row (dead), a row without a time (dead), three on time: the third fires.
    rows = [row(BASE, 1), row(None, 2), row(watermark + 10, 3), row(watermark + 20, 4), row(watermark + 30, 5)]
    slots = _slots_of(rows)
    proc = DetectionProcessor(slots, chained=True)
    tester = TwsTester(proc, timeMode="EventTime", eventTimeExtractor=lambda r: 1 << 62)
    tester._currentWatermarkMs = watermark
    tester.handle.setGroupingKey((GID, 0))
    got = _arrow_reads(proc.handleInputRows((GID, 0), iter([_in_frame(rows, slots)]), tester._getTimerValues()),
                       CHAINED_SCHEMA)
    names = CHAINED_SCHEMA.names
    by_seq = {r[names.index("seq")]: r for r in got}
    assert sorted(by_seq) == [1, 2, 5]
    for seq, r in by_seq.items():
        ts, et = r[names.index("ts_ms")], r[names.index("et")]
        assert et.timestamp() * 1000 > watermark, (seq, et)
        assert et.timestamp() * 1000 == max(ts or 0, watermark + 1)
    assert by_seq[1][names.index("ts_ms")] == BASE  # the late row keeps its own time


def test_the_second_operator_passes_the_firsts_output_through_unchanged():
    rule, _ = _rule(json.dumps(parse_rule(VELOCITY[0]).model_dump(mode="json")))
    rows = [_out("dead", rule, Row(None, 7, raw="{}", topic="t"), reason="late"),  # type: ignore[arg-type]
            _out("detection", rule, Row(BASE, 8, raw='{"a": 1}', topic="t"), Emit(Row(BASE, 8), agg_value=3.0))]
    # As the Python worker hands them over: by name, with the operator input's other columns.
    frame = pd.DataFrame([dict(zip(OUTPUT_SCHEMA.names, r, strict=True)) for r in rows])
    frame.insert(0, "gid", PASS_GID)
    frame["k"], frame["m"], frame["t0"] = None, None, np.nan
    proc = DetectionProcessor([], passes=True)
    tester = TwsTester(proc, timeMode="EventTime", eventTimeExtractor=lambda r: 1 << 62)
    tester.handle.setGroupingKey((PASS_GID, 0))
    got = _arrow_reads(proc.handleInputRows((PASS_GID, 0), iter([frame]), tester._getTimerValues()), OUTPUT_SCHEMA)
    assert got == rows
