"""Per-key velocity and correlation logic of the live job, free of Spark.

The stateful processor (processor.py) loads a key's state, calls these functions with
the micro-batch's rows and stores what they return. Keeping the logic pure makes it
unit-testable against the reference evaluator and keeps the Spark glue thin.

Live semantics (DESIGN.md "Order"): each event is judged on arrival against what its
key has seen; within one micro-batch, rows are taken in (event time, arrival) order,
which for input that arrives in event-time order per key is exactly the backtest's
order, hence the same detections.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_right, insort
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from spark_jobs.rules.model import CorrelationRule, VelocityRule

DirectMatch = Callable[[str | None], bool]


@dataclass
class Row:
    """One input row of a key (an event for velocity, a primary or context record)."""

    ts: int
    seq: int
    num: float | None = None  # numeric value (aggregation / event value / context value)
    jv: str | None = None  # JSON text of the value (distinct_count, `last` direct context)
    raw: str = ""
    topic: str = ""


@dataclass
class Emit:
    row: Row
    agg_value: float | None = None
    ctx_json: str | None = None
    metric_value: float | None = None
    ctx_record: str | None = None
    ctx_num: float | None = None


@dataclass
class VelocityState:
    window: list[Row] = field(default_factory=list)  # qualifying events, arrival order
    prev_above: bool | None = None  # at the key's previous qualifying event


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


def velocity_step(rule: VelocityRule, state: VelocityState, rows: Iterable[Row]) -> list[Emit]:
    """Take rows (already sorted) into the key's window; return the emits."""
    emits: list[Emit] = []
    w = rule.window_ms
    thr = float(rule.threshold)
    if rule.aggregation_type == "count":
        # Same count as filtering the window, by bisection over the sorted times: a
        # window of a busy (or ungrouped) key holds many events.
        times = sorted(e.ts for e in state.window)
        for row in rows:
            state.window.append(row)
            insort(times, row.ts)
            agg = float(bisect_right(times, row.ts) - bisect_right(times, row.ts - w))
            above = agg >= thr
            if above and (rule.emit_mode == "all_events" or not state.prev_above):
                emits.append(Emit(row, agg_value=agg))
            state.prev_above = above
        return emits
    for row in rows:
        state.window.append(row)
        in_window = [e for e in state.window if row.ts - w < e.ts <= row.ts]
        agg = _aggregate(rule.aggregation_type, in_window)
        above = agg >= thr
        if above and (rule.emit_mode == "all_events" or not state.prev_above):
            emits.append(Emit(row, agg_value=agg))
        state.prev_above = above
    return emits


def evict_window(state: VelocityState, rule: VelocityRule, horizon_ms: int) -> None:
    """Forget entries no future event can see: ts <= horizon - window."""
    cutoff = horizon_ms - rule.window_ms
    state.window = [e for e in state.window if e.ts > cutoff]


@dataclass
class CorrelationState:
    context: list[Row] = field(default_factory=list)
    pending: list[Row] = field(default_factory=list)  # primaries held for context (`last`)


@dataclass
class Resolved:
    num: float | None  # last value or mean
    jv: str | None  # JSON text of the last value (None for means)
    record: str | None  # the context record (`last`) or {mean, std, count}
    std: float | None = None


def resolve(rule: CorrelationRule, context: list[Row], t: int) -> Resolved | None:
    """Context in [t - lookback, t] resolved per the rule; None when there is none usable."""
    lo = t - rule.lookback_ms
    usable = [c for c in context if lo <= c.ts <= t]
    if rule.context_resolution == "last":
        if not usable:
            return None
        c = max(usable, key=lambda c: (c.ts, c.seq))
        return Resolved(c.num, c.jv, c.raw)
    nums = [c.num for c in usable if c.num is not None]
    if not nums or len(nums) < rule.min_context_points:
        return None
    mean = math.fsum(nums) / len(nums)
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in nums) / len(nums))
    return Resolved(mean, None, json.dumps({"mean": mean, "std": std, "count": len(nums)}), std)


_OPS = {
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
}


def judge(rule: CorrelationRule, primary: Row, resolved: Resolved, direct_match: DirectMatch) -> Emit | None:
    """Apply the metric and the condition. `direct_match(ctx_json)` evaluates a `last`
    direct condition on a JSON value with the engine's comparison semantics."""
    num, jv, record, std = resolved.num, resolved.jv, resolved.record, resolved.std
    op, value = rule.condition.operator, rule.condition.value
    if rule.metric == "direct" and rule.context_resolution == "last":
        if not direct_match(jv):
            return None
        return Emit(primary, ctx_json=jv, metric_value=num, ctx_record=record, ctx_num=num)
    ev = primary.num
    metric: float | None
    if rule.metric == "direct":
        metric = num
    elif ev is None or num is None:
        return None
    elif rule.metric == "ratio_deviation":
        metric = abs(ev / num - 1.0) if num != 0 else None
    elif rule.metric == "difference":
        metric = ev - num
    else:  # z_score
        metric = (ev - num) / std if std else None
    if metric is None or not _OPS[op](metric, float(value)):
        return None
    # Under mean/mean_std the context value is the mean; it is rendered in the JVM
    # from ctx_num, exactly as the backtest renders it.
    ctx_json = jv if rule.context_resolution == "last" else None
    return Emit(primary, ctx_json=ctx_json, metric_value=metric, ctx_record=record, ctx_num=num)


def correlation_step(
    rule: CorrelationRule,
    state: CorrelationState,
    primaries: list[Row],
    contexts: list[Row],
    watermark_ms: int,
    direct_match: DirectMatch,
) -> list[Emit]:
    """Context first (so a primary sees context of its own batch, whatever the arrival
    order), then held primaries, then the batch's primaries in (ts, seq) order."""
    state.context.extend(contexts)
    emits: list[Emit] = []
    still: list[Row] = []
    for p in sorted(state.pending, key=lambda r: (r.ts, r.seq)):
        resolved = resolve(rule, state.context, p.ts)
        if resolved is not None:
            e = judge(rule, p, resolved, direct_match)
            if e is not None:
                emits.append(e)
        elif p.ts >= watermark_ms:
            still.append(p)  # context may still arrive until the watermark passes it
    state.pending = still
    for p in primaries:
        resolved = resolve(rule, state.context, p.ts)
        if resolved is None:
            if rule.context_resolution == "last":
                state.pending.append(p)
            continue
        e = judge(rule, p, resolved, direct_match)
        if e is not None:
            emits.append(e)
    return emits


def evict_context(state: CorrelationState, rule: CorrelationRule, watermark_ms: int) -> None:
    """Context older than (watermark - lookback) can serve no primary still to come.

    The latest record is kept for `last` only while it is inside that horizon too."""
    cutoff = watermark_ms - rule.lookback_ms
    state.context = [c for c in state.context if c.ts >= cutoff]
    state.pending = [p for p in state.pending if p.ts >= watermark_ms]
