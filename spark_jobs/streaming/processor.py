"""The stateful processor of the live job: transformWithState keyed by (rule_id, key).

State per key lives in Spark's state store (RocksDB) and is checkpointed with the
query: the velocity window (ListState), the correlation context buffer and held
primaries (ListState), and a small ValueState (rule version, last crossing flag, max
event time). Event-time timers clear a key once the watermark has passed everything it
could still need, so state stays bounded.

Rows older than the job watermark are not dropped silently: they come out as dead
letters ("late"). That is why the watermark is read here from the timer values instead
of being enforced by Spark on the operator's input.
"""

from __future__ import annotations

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

ENTRY_SCHEMA = StructType([
    StructField("ts", LongType()),
    StructField("seq", LongType()),
    StructField("num", DoubleType()),
    StructField("jv", StringType()),
    StructField("raw", StringType()),
    StructField("topic", StringType()),
])
META_SCHEMA = StructType([
    StructField("version", StringType()),
    StructField("signature", StringType()),
    StructField("prev_above", BooleanType()),
    StructField("max_ts", LongType()),
    StructField("timer", LongType()),
])

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

_RULES: dict[tuple[str, str], AnyRule] = {}


def _rule(rule_json: str) -> AnyRule:
    data = json.loads(rule_json)
    key = (data["rule_id"], rule_json)
    rule = _RULES.get(key)
    if rule is None:
        if len(_RULES) > 10_000:
            _RULES.clear()
        rule = _RULES[key] = parse_rule(data)
    return rule


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


def _to_row(r: Any) -> Row:
    return Row(ts=r["ts_ms"], seq=r["seq"], num=r["num"], jv=r["jv"], raw=r["raw"], topic=r["topic"])


def _entry(e: Row) -> tuple:
    return (e.ts, e.seq, e.num, e.jv, e.raw if e.raw else None, e.topic or None)


def _from_entry(t: tuple) -> Row:
    return Row(ts=t[0], seq=t[1], num=t[2], jv=t[3], raw=t[4] or "", topic=t[5] or "")


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
    """One instance per task; `handleInputRows` runs per (rule_id, key) of a batch."""

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.entries = handle.getListState("entries", ENTRY_SCHEMA)
        self.pending = handle.getListState("pending", ENTRY_SCHEMA)
        self.meta = handle.getValueState("meta", META_SCHEMA)

    # -- state helpers -----------------------------------------------------------------
    def _load_meta(self) -> dict:
        if self.meta.exists():
            v = self.meta.get()
            return {"version": v[0], "signature": v[1], "prev_above": v[2], "max_ts": v[3], "timer": v[4]}
        return {"version": None, "signature": None, "prev_above": None, "max_ts": None, "timer": None}

    def _list(self, state: Any) -> list[Row]:
        return [_from_entry(t) for t in state.get()] if state.exists() else []

    def _store(self, state: Any, rows: list[Row]) -> None:
        if rows:
            state.put([_entry(e) for e in rows])
        else:
            state.clear()

    def _schedule(self, meta: dict, at_ms: int) -> None:
        if meta["timer"] != at_ms:
            if meta["timer"] is not None:
                self.handle.deleteTimer(meta["timer"])
            self.handle.registerTimer(at_ms)
            meta["timer"] = at_ms

    # -- the API -----------------------------------------------------------------------
    def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Iterator[SparkRow]:
        rows = list(rows)
        # One consistent rule set per micro-batch: every row of a key has the same rule.
        rule = _rule(rows[0]["rule_json"])
        watermark = timerValues.getCurrentWatermarkInMs()
        meta = self._load_meta()
        sig = _signature(rule)
        reset = meta["signature"] is not None and meta["signature"] != sig
        if reset:
            self.entries.clear()
            self.pending.clear()
            meta["prev_above"] = None

        late: list[Any] = []
        fresh: list[Any] = []
        for r in rows:
            # Routed primaries were judged for lateness when they entered the velocity
            # rule; re-injected a batch later, they must not be late a second time.
            is_late = r["event_time"] and r["role"] != "routed" and watermark > 0 and r["ts_ms"] < watermark
            (late if is_late else fresh).append(r)
        for r in late:
            yield _out("dead", rule, _to_row(r), reason=f"late event: older than the job watermark ({watermark} ms)")
        fresh.sort(key=lambda r: (r["ts_ms"], r["seq"]))

        if isinstance(rule, VelocityRule):
            yield from self._velocity(rule, fresh, meta, watermark)
        elif isinstance(rule, CorrelationRule):
            yield from self._correlation(rule, fresh, meta, watermark)
        meta["version"], meta["signature"] = rule.version, sig
        self.meta.update((meta["version"], meta["signature"], meta["prev_above"], meta["max_ts"], meta["timer"]))

    def _velocity(self, rule: VelocityRule, rows: list[Any], meta: dict, watermark: int) -> Iterator[SparkRow]:
        state = VelocityState(self._list(self.entries), meta["prev_above"])
        new = [_to_row(r) for r in rows]
        emits = velocity_step(rule, state, new)
        if new:
            meta["max_ts"] = max(meta["max_ts"] or new[-1].ts, max(r.ts for r in new))
        horizon = meta["max_ts"] or 0
        if rule.uses_event_time and watermark > 0:
            horizon = min(horizon, watermark)
        evict_window(state, rule, horizon)
        meta["prev_above"] = state.prev_above
        # Only what aggregation needs is kept in the window: no event text.
        self._store(self.entries, [Row(e.ts, e.seq, e.num, e.jv) for e in state.window])
        if rule.uses_event_time and meta["max_ts"] is not None:
            self._schedule(meta, meta["max_ts"] + rule.window_ms + int(rule.watermark_delay * 1000))
        kind = "detection" if rule.emit_to_sink else "routed"
        for e in emits:
            yield _out(kind, rule, e.row, e)

    def _correlation(self, rule: CorrelationRule, rows: list[Any], meta: dict, watermark: int) -> Iterator[SparkRow]:
        state = CorrelationState(self._list(self.entries), self._list(self.pending))
        primaries = [_to_row(r) for r in rows if r["role"] != "context"]
        contexts = [_to_row(r) for r in rows if r["role"] == "context"]
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

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[SparkRow]:
        """Nothing of this key can matter any more: its newest event is a full window
        (plus the allowed lateness) behind the watermark."""
        self.entries.clear()
        self.pending.clear()
        self.meta.clear()
        return iter(())

    def close(self) -> None:
        pass
