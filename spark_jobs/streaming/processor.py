"""The stateful processor of the live job: transformWithState keyed by (rule_id, bucket).

A bucket is `pmod(xxhash64(key), N)` of the rule's grouping key (job.py), so one Python
call serves every key of a rule that falls in that bucket. State per key lives in a
MapState keyed by the key, in Spark's state store (RocksDB), checkpointed with the
query: one value per key holding the rule version/signature, the last crossing flag,
the newest event time, the key's expiry and its velocity window or correlation
buffers. Only keys present in a micro-batch are read and written (one getValue, one
updateValue each).

Expiry: each key has its own expiry time (its newest event a full window, plus the
allowed lateness, behind); a key is forgotten once the watermark reaches it, exactly
as a per-key event-time timer would forget it. The bucket keeps one event-time timer
at (or before) the earliest expiry of its keys; it is moved only when a key needs an
earlier one, and when it fires the expired keys are removed and the timer re-set for
the next.

Rows older than the job watermark are not dropped silently: they come out as dead
letters ("late"). That is why the watermark is read here from the timer values instead
of being enforced by Spark on the operator's input.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

from pyspark.sql import Row as SparkRow
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import BooleanType, DoubleType, LongType, StringType, StructField, StructType

from spark_jobs.engine.conditions import compare_json
from spark_jobs.rules.model import AnyRule, CorrelationRule, VelocityRule, parse_rule
from spark_jobs.streaming.keyed_logic import (
    CorrelationState,
    Emit,
    Row,
    VelocityState,
    correlation_step,
    evict_context,
    evict_window,
    velocity_step,
)

KEY_SCHEMA = StructType([StructField("k", StringType())])
# One key's state. `entries` / `pending` are JSON: the velocity window as columns
# {"t": [...], "n": [...], "j": [...]} (a column of only nulls is left out), the
# correlation buffers as lists of [ts, seq, num, jv, raw, topic].
KEY_STATE_SCHEMA = StructType([
    StructField("version", StringType()),
    StructField("signature", StringType()),
    StructField("prev_above", BooleanType()),
    StructField("max_ts", LongType()),
    StructField("expiry", LongType()),
    StructField("entries", StringType()),
    StructField("pending", StringType()),
])
BUCKET_SCHEMA = StructType([StructField("timer", LongType())])

OUTPUT_SCHEMA = StructType([
    StructField("kind", StringType()),  # detection | routed | dead
    StructField("rule_id", StringType()),
    StructField("rule_version", StringType()),
    StructField("rule_type", StringType()),
    StructField("rule_name", StringType()),
    StructField("topic", StringType()),
    StructField("seq", LongType()),
    StructField("ts_ms", LongType()),
    StructField("raw", StringType()),
    StructField("agg_type", StringType()),
    StructField("agg_value", DoubleType()),
    StructField("metric", StringType()),
    StructField("emit_context", BooleanType()),
    StructField("ctx_num", DoubleType()),
    StructField("ctx_json", StringType()),
    StructField("metric_value", DoubleType()),
    StructField("ctx_record", StringType()),
    StructField("reason", StringType()),
])

_RULES: dict[tuple[str, str], tuple[AnyRule, str]] = {}


def _rule(rule_json: str) -> tuple[AnyRule, str]:
    """The rule of a row and its state signature, parsed once per distinct rule text."""
    data = json.loads(rule_json)
    key = (data["rule_id"], rule_json)
    hit = _RULES.get(key)
    if hit is None:
        if len(_RULES) > 10_000:
            _RULES.clear()
        rule = parse_rule(data)
        hit = _RULES[key] = (rule, _signature(rule))
    return hit


def _signature(rule: AnyRule) -> str:
    """What a window or context buffer depends on; a version that changes it resets state.

    A new threshold or emit mode keeps the window (it applies from the next event);
    new conditions, grouping or value fields mean old entries no longer qualify.
    """
    d = rule.model_dump(mode="json")
    keep = ("source_topic", "conditions", "group_by", "aggregation_field", "aggregation_type", "time_mode",
            "timestamp_field", "context_topic", "correlation_key", "context_value_field", "context_type_field",
            "context_type_value", "event_value_field")
    return json.dumps({k: d.get(k) for k in keep}, sort_keys=True)


# An input row, read once from Spark's Row (by position: name lookups cost per access).
_IN = ("role", "event_time", "ts_ms", "seq", "topic", "raw", "num", "jv")
ROLE, EVENT_TIME, TS, SEQ, TOPIC, RAW, NUM, JV = range(len(_IN))


def _to_row(r: tuple) -> Row:
    return Row(ts=r[TS], seq=r[SEQ], num=r[NUM], jv=r[JV], raw=r[RAW], topic=r[TOPIC])


# -- the stored form of a key's entries --------------------------------------------------


def _dump_window(window: list[Row]) -> str | None:
    """Velocity window: only what aggregation needs (no event text, no seq)."""
    if not window:
        return None
    cols: dict[str, list] = {"t": [e.ts for e in window]}
    n = [e.num for e in window]
    if any(x is not None for x in n):
        cols["n"] = n
    j = [e.jv for e in window]
    if any(x is not None for x in j):
        cols["j"] = j
    return json.dumps(cols, separators=(",", ":"))


def _load_window(text: str | None) -> list[Row]:
    if not text:
        return []
    cols = json.loads(text)
    t = cols["t"]
    none = [None] * len(t)
    return [Row(ts, 0, n, j) for ts, n, j in zip(t, cols.get("n") or none, cols.get("j") or none, strict=True)]


def _dump_rows(rows: list[Row]) -> str | None:
    if not rows:
        return None
    return json.dumps([[e.ts, e.seq, e.num, e.jv, e.raw or None, e.topic or None] for e in rows], separators=(",", ":"))


def _load_rows(text: str | None) -> list[Row]:
    if not text:
        return []
    return [Row(ts=t[0], seq=t[1], num=t[2], jv=t[3], raw=t[4] or "", topic=t[5] or "") for t in json.loads(text)]


def _out(kind: str, rule: AnyRule, row: Row, emit: Emit | None = None, reason: str | None = None) -> SparkRow:
    return SparkRow(
        kind=kind, rule_id=rule.rule_id, rule_version=rule.version, rule_type=rule.rule_type, rule_name=rule.name,
        topic=row.topic, seq=row.seq, ts_ms=row.ts, raw=row.raw,
        agg_type=rule.aggregation_type if isinstance(rule, VelocityRule) else None,
        agg_value=emit.agg_value if emit else None,
        metric=rule.metric if isinstance(rule, CorrelationRule) else None,
        emit_context=rule.emit_mode in ("context", "both") if isinstance(rule, CorrelationRule) else None,
        ctx_num=emit.ctx_num if emit else None,
        ctx_json=emit.ctx_json if emit else None,
        metric_value=emit.metric_value if emit else None, ctx_record=emit.ctx_record if emit else None,
        reason=reason,
    )


class DetectionProcessor(StatefulProcessor):
    """One instance per task; `handleInputRows` runs per (rule_id, bucket) of a batch."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.keys = handle.getMapState("keys", KEY_SCHEMA, KEY_STATE_SCHEMA)
        self.bucket = handle.getValueState("bucket", BUCKET_SCHEMA)

    # -- the bucket timer ----------------------------------------------------------------
    def _timer(self) -> int | None:
        v = self.bucket.get()  # None when absent: no exists() round trip
        return v[0] if v is not None else None

    def _set_timer(self, current: int | None, at_ms: int | None) -> None:
        """Register `at_ms` as the bucket's one timer (None: no timer), replacing `current`."""
        if at_ms == current:
            return
        if current is not None:
            self.handle.deleteTimer(current)
        if at_ms is None:
            self.bucket.clear()
        else:
            self.handle.registerTimer(at_ms)
            self.bucket.update((at_ms,))

    # -- the API -------------------------------------------------------------------------
    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[SparkRow]:
        it = iter(rows)
        first = next(it)
        fields = list(first.__fields__)
        ik = fields.index("k")
        pos = [fields.index(n) for n in _IN]
        # One consistent rule set per micro-batch: every row of a group has the same rule.
        rule, sig = _rule(first[fields.index("rule_json")])
        by_key: dict[str, list[tuple]] = {}
        for r in itertools.chain((first,), it):
            by_key.setdefault(r[ik], []).append(tuple([r[i] for i in pos]))
        watermark = timerValues.getCurrentWatermarkInMs()
        earliest: int | None = None
        for k, key_rows in by_key.items():
            out, expiry = self._key(rule, sig, k, key_rows, watermark)
            yield from out
            if expiry is not None and (earliest is None or expiry < earliest):
                earliest = expiry
        if earliest is not None:
            # Keys not in this batch keep expiries at or after the registered timer;
            # it only has to move when a key of this batch needs an earlier one.
            current = self._timer()
            if current is None or earliest < current:
                self._set_timer(current, earliest)

    def _key(self, rule: AnyRule, sig: str, k: str, rows: list[tuple], watermark: int) -> tuple[list[SparkRow], int | None]:
        out: list[SparkRow] = []
        fresh: list[tuple] = []
        for r in rows:
            if r[TS] is None:
                # An event-time rule and no usable timestamp: the row never touches state.
                out.append(_out("dead", rule, _to_row(r),
                                reason=f"missing or unparseable timestamp needed by {rule.rule_type} rule"))
            # Routed primaries were judged for lateness when they entered the velocity
            # rule; re-injected a batch later, they must not be late a second time.
            elif r[EVENT_TIME] and r[ROLE] != "routed" and watermark > 0 and r[TS] < watermark:
                out.append(_out("dead", rule, _to_row(r),
                                reason=f"late event: older than the job watermark ({watermark} ms)"))
            else:
                fresh.append(r)
        if all(r[TS] is None for r in rows):
            return out, None
        fresh.sort(key=lambda r: (r[TS], r[SEQ]))

        v = self.keys.getValue((k,))
        if v is None:
            meta = {"version": None, "signature": None, "prev_above": None, "max_ts": None, "expiry": None}
            entries_text = pending_text = None
        else:
            meta = {"version": v[0], "signature": v[1], "prev_above": v[2], "max_ts": v[3], "expiry": v[4]}
            entries_text, pending_text = v[5], v[6]
        if meta["signature"] is not None and meta["signature"] != sig:
            entries_text = pending_text = None
            meta["prev_above"] = None

        if isinstance(rule, VelocityRule):
            entries_text = self._velocity(rule, fresh, meta, watermark, entries_text, out)
        elif isinstance(rule, CorrelationRule):
            entries_text, pending_text = self._correlation(rule, fresh, meta, watermark, entries_text, pending_text, out)
        meta["version"], meta["signature"] = rule.version, sig
        self.keys.updateValue((k,), (meta["version"], meta["signature"], meta["prev_above"], meta["max_ts"],
                                     meta["expiry"], entries_text, pending_text))
        return out, meta["expiry"]

    def _velocity(self, rule: VelocityRule, rows: list[Any], meta: dict, watermark: int, entries: str | None,
                  out: list[SparkRow]) -> str | None:
        state = VelocityState(_load_window(entries), meta["prev_above"])
        new = [_to_row(r) for r in rows]
        emits = velocity_step(rule, state, new)
        if new:
            meta["max_ts"] = max(meta["max_ts"] or new[-1].ts, max(r.ts for r in new))
        horizon = meta["max_ts"] or 0
        if rule.uses_event_time and watermark > 0:
            horizon = min(horizon, watermark)
        evict_window(state, rule, horizon)
        meta["prev_above"] = state.prev_above
        if rule.uses_event_time and meta["max_ts"] is not None:
            meta["expiry"] = meta["max_ts"] + rule.window_ms + int(rule.watermark_delay * 1000)
        kind = "detection" if rule.emit_to_sink else "routed"
        out.extend(_out(kind, rule, e.row, e) for e in emits)
        return _dump_window(state.window)

    def _correlation(self, rule: CorrelationRule, rows: list[Any], meta: dict, watermark: int, entries: str | None,
                     pending: str | None, out: list[SparkRow]) -> tuple[str | None, str | None]:
        state = CorrelationState(_load_rows(entries), _load_rows(pending))
        primaries = [_to_row(r) for r in rows if r[ROLE] != "context"]
        contexts = [_to_row(r) for r in rows if r[ROLE] == "context"]
        op, value = rule.condition.operator, rule.condition.value
        emits = correlation_step(rule, state, primaries, contexts, watermark, lambda jv: compare_json(jv, op, value))
        ts_all = [r.ts for r in primaries + contexts]
        if ts_all:
            meta["max_ts"] = max([meta["max_ts"] or ts_all[0], *ts_all])
        if watermark > 0:
            evict_context(state, rule, watermark)
        if meta["max_ts"] is not None:
            meta["expiry"] = meta["max_ts"] + rule.lookback_ms + int(rule.watermark_delay * 1000)
        out.extend(_out("detection", rule, e.row, e) for e in emits)
        return _dump_rows(state.context), _dump_rows(state.pending)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[SparkRow]:
        """Forget the keys whose newest event is a full window (plus the allowed lateness)
        behind the watermark: the keys whose own timer would have fired (expiry <=
        watermark, Spark's rule for event-time timers). Then re-arm for the next."""
        watermark = timerValues.getCurrentWatermarkInMs()
        expired: list[str] = []
        earliest: int | None = None
        for (k,), v in self.keys.iterator():
            expiry = v[4]
            if expiry is None:
                continue
            if expiry <= watermark:
                expired.append(k)
            elif earliest is None or expiry < earliest:
                earliest = expiry
        for k in expired:
            self.keys.removeKey((k,))
        # Spark deletes the fired timer after this returns; `earliest` > watermark >= it.
        if earliest is None:
            self.bucket.clear()
        else:
            self.handle.registerTimer(earliest)
            self.bucket.update((earliest,))
        return iter(())

    def close(self) -> None:
        pass
