"""Per-key velocity and correlation logic of the live job, free of Spark.

The stateful processor (processor.py) loads a key's state, calls these functions with
the micro-batch's rows and stores what they return. Keeping the logic pure makes it
unit-testable against the reference evaluator and keeps the Spark glue thin.

The velocity window is held as columns (lists) sorted by event time: the processor
stores them as bytes and loads them without building an object per event, and sorted,
an event's window is a range found by bisection instead of a filter over every entry.

Live semantics (docs/rule-language.md, "Order, the job watermark and late events"):
each event is judged on arrival against what its
key has seen; within one micro-batch, rows are taken in (event time, arrival) order,
which for input that arrives in event-time order per key is exactly the backtest's
order, hence the same detections.

The JVM keyed operator (spark_jobs/jvm/processor, Velocity.java and Correlation.java)
ports these functions; they must change together (test_jvm_keyed_operator.py).
"""

from __future__ import annotations

import itertools
import json
import math
import operator
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np

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


_NAN = float("nan")


@dataclass
class VelocityState:
    """A key's window as aligned columns sorted by event time (equal times in arrival
    order). No aggregate depends on the order of a window's events, and sorted, each
    event's window is one slice of the stored columns plus one of the batch's rows."""

    ts: list[int] = field(default_factory=list)  # event times, ascending
    num: list[float] = field(default_factory=list)  # values; NaN: the event has none
    jv: list[str | None] = field(default_factory=list)  # JSON text of the values
    prev_above: bool | None = None  # at the key's previous qualifying event

    @classmethod
    def of(cls, rows: Iterable[Row], prev_above: bool | None = None) -> VelocityState:
        """A window holding `rows` (in any order)."""
        rows = sorted(rows, key=lambda r: r.ts)
        return cls([r.ts for r in rows], _nums(rows), [r.jv for r in rows], prev_above)

    def entries(self) -> list[tuple[int, float | None, str | None]]:
        """(ts, num, jv) per event, in window order (for tests and debugging)."""
        return [(t, None if n != n else n, j) for t, n, j in zip(self.ts, self.num, self.jv, strict=True)]


def _nums(rows: list[Row]) -> list[float]:
    return [_NAN if r.num is None else r.num for r in rows]


def velocity_step(rule: VelocityRule, state: VelocityState, rows: Iterable[Row]) -> list[Emit]:
    """Take rows (sorted by time) into the key's window; return the emits.

    Each event's aggregate is over the window's events with time in (ts - window, ts]:
    the stored events in that range and the batch's rows up to and including itself,
    two slices found by bisection instead of a filter over the whole window per event
    (a busy or ungrouped key's window holds many events). The slices only move forward
    through a batch, so where they hold many values the aggregates are kept up to date
    as values enter and leave (`_aggregates`). The results are those of filtering,
    exact sums (math.fsum) included.
    """
    rows = list(rows)
    if not rows:
        return []
    ts = [r.ts for r in rows]
    if any(b < a for a, b in zip(ts, ts[1:], strict=False)):
        raise ValueError("velocity_step needs rows sorted by time")
    num = _nums(rows)
    jv = [r.jv for r in rows]
    w = rule.window_ms
    old = state.ts
    o_lo, o_hi, n_lo = [], [], []
    for i, t in enumerate(ts):
        hi = bisect_right(old, t)
        o_hi.append(hi)
        o_lo.append(bisect_right(old, t - w, 0, hi))
        n_lo.append(bisect_right(ts, t - w, 0, i + 1))
    aggs = _aggregates(rule.aggregation_type, state, num, jv, o_lo, o_hi, n_lo, list(range(1, len(ts) + 1)))
    emits: list[Emit] = []
    thr = float(rule.threshold)
    every = rule.emit_mode == "all_events"
    prev = state.prev_above
    # The key's newest event so far; when it is out of an event's window, the window had
    # emptied and the key's previous evaluation no longer counts (a new episode): what
    # dropping an expired key's state gives, decided the same for the backtest (README).
    newest = old[-1] if old else None
    for row, t, agg in zip(rows, ts, aggs, strict=True):
        if newest is None or newest <= t - w:
            prev = None
        above = agg >= thr
        if above and (every or not prev):
            emits.append(Emit(row, agg_value=agg))
        prev = above
        newest = t if newest is None else max(newest, t)
    state.prev_above = prev
    _insert(state, ts, num, jv)
    return emits


# Below this many values in all of a batch's windows together, each event's window
# is aggregated from its two slices (C loops, nothing to set up); from it on, sums and
# distinct counts are kept up to date as values enter and leave, and min/max come from
# one numpy reduceat.
_SLIDE_FROM = 2_000


def _aggregates(kind: str, state: VelocityState, num: list[float], jv: list[str | None], o_lo: list[int],
                o_hi: list[int], n_lo: list[int], n_hi: list[int]) -> list[float]:
    """The aggregate at each new event: over old[o_lo:o_hi] + new[n_lo:n_hi]."""
    if kind == "count":
        return [float(b - a + d - c) for a, b, c, d in zip(o_lo, o_hi, n_lo, n_hi, strict=True)]
    # Only these stored values can be in a window of this batch.
    lo, hi = o_lo[0], o_hi[-1]
    old, new = (state.jv[lo:hi], jv) if kind == "distinct_count" else (state.num[lo:hi], num)
    o_lo, o_hi = [x - lo for x in o_lo], [x - lo for x in o_hi]
    if sum(o_hi) - sum(o_lo) + sum(n_hi) - sum(n_lo) >= _SLIDE_FROM:
        if kind == "distinct_count":
            return _distinct_counts(old, new, o_lo, o_hi, n_lo, n_hi)
        if kind in ("min", "max"):
            return _extremes(kind, old, new, o_lo, o_hi, n_lo, n_hi)
        if _bounded(old) and _bounded(new):
            sums = _window_sums(old, new, o_lo, o_hi, n_lo, n_hi)
            if kind == "sum":
                return sums
            return [s / (b - a + d - c) for s, a, b, c, d in zip(sums, o_lo, o_hi, n_lo, n_hi, strict=True)]
    gaps = kind != "distinct_count" and (any(map(math.isnan, old)) or any(map(math.isnan, new)))
    out = []
    for a, b, c, d in zip(o_lo, o_hi, n_lo, n_hi, strict=True):
        values = old[a:b] + new[c:d]
        out.append(_aggregate(kind, [x for x in values if x == x] if gaps else values))
    return out


def _aggregate(kind: str, values: list) -> float:
    """One window's aggregate by definition (values: JSON texts or numbers, no NaN)."""
    if kind == "distinct_count":
        return float(len(set(values)))
    if kind == "sum":
        return math.fsum(values)
    if kind == "avg":
        return math.fsum(values) / len(values)  # ZeroDivisionError without values
    return min(values) if kind == "min" else max(values)  # ValueError without values


def _moves(lo: list[int], hi: list[int]) -> Iterable[tuple[int, int, int, int]]:
    """For forward-moving ranges [lo[i], hi[i]): per i the indices that leave ([a, b))
    and enter ([c, d)) relative to the previous range (empty before the first)."""
    a = b = lo[0] if lo else 0
    for a2, b2 in zip(lo, hi, strict=True):
        if a2 >= b:
            yield a, b, a2, b2
        else:
            yield a, a2, b, b2
        a, b = a2, b2


def _distinct_counts(old: list, new: list, o_lo: list[int], o_hi: list[int], n_lo: list[int],
                     n_hi: list[int]) -> list[float]:
    counts: Counter = Counter()
    out: list[float] = []
    for (oa, ob, oc, od), (na, nb, nc, nd) in zip(_moves(o_lo, o_hi), _moves(n_lo, n_hi), strict=True):
        for x in itertools.chain(old[oa:ob], new[na:nb]):
            c = counts[x] - 1
            if c:
                counts[x] = c
            else:
                del counts[x]
        counts.update(old[oc:od])
        counts.update(new[nc:nd])
        out.append(float(len(counts)))
    return out


def _extremes(kind: str, old: list[float], new: list[float], o_lo: list[int], o_hi: list[int], n_lo: list[int],
              n_hi: list[int]) -> list[float]:
    f = np.fmax if kind == "max" else np.fmin  # NaN (no value) is skipped
    agg = f(_range_reduce(f, np.array(old, np.float64), o_lo, o_hi),
            _range_reduce(f, np.array(new, np.float64), n_lo, n_hi))
    if bool(np.isnan(agg).any()):
        raise ValueError(f"{kind}() of a window without values")
    return agg.tolist()


def _range_reduce(f: np.ufunc, a: np.ndarray, lo: list[int], hi: list[int]) -> np.ndarray:
    """f over a[lo[i]:hi[i]] per i, NaN where the range is empty: one reduceat call."""
    if len(a) == 0:
        return np.full(len(lo), np.nan)
    padded = np.append(a, np.nan)  # every index, hi == len(a) included, is in range
    idx = np.empty(2 * len(lo), np.intp)
    idx[0::2], idx[1::2] = lo, hi
    out = f.reduceat(padded, idx)[0::2]
    out[np.asarray(lo) >= np.asarray(hi)] = np.nan
    return out


# Sliding sums: values that enter are added, values that leave are added negated, and
# the list is folded into its exact partials (`_exact_parts`) when it grows. fsum of a
# list with the same exact sum as the window's values is the window's fsum (fsum is
# correctly rounded). Only for values with no NaN (no value), inf or huge magnitude,
# where fsum of other terms could overflow differently.
_FOLD_AT = 64
_HUGE = 1e300


def _exact_parts(xs: list[float]) -> list[float]:
    """A short list of floats whose exact sum equals the exact sum of `xs` (finite)."""
    parts: list[float] = []
    neg: list[float] = []
    while True:
        s = math.fsum(xs + neg)
        if s == 0.0:  # a nonzero exact sum of doubles is at least the least subnormal
            return parts
        parts.append(s)
        neg.append(-s)


def _bounded(xs: list[float]) -> bool:
    """Every value finite and below _HUGE in magnitude (so are their sums)."""
    try:
        return math.fsum(map(abs, xs)) < _HUGE  # NaN and inf compare False
    except (OverflowError, ValueError):
        return False


def _window_sums(old: list[float], new: list[float], o_lo: list[int], o_hi: list[int], n_lo: list[int],
                 n_hi: list[int]) -> list[float]:
    """Per event: fsum of old[o_lo:o_hi] + new[n_lo:n_hi] (all values _bounded)."""
    sums: list[float] = []
    acc: list[float] = []
    for (oa, ob, oc, od), (na, nb, nc, nd) in zip(_moves(o_lo, o_hi), _moves(n_lo, n_hi), strict=True):
        acc.extend(map(operator.neg, old[oa:ob]))
        acc.extend(map(operator.neg, new[na:nb]))
        acc += old[oc:od]
        acc += new[nc:nd]
        if len(acc) > _FOLD_AT:
            acc = _exact_parts(acc)
        sums.append(math.fsum(acc))
    return sums


def _insert(state: VelocityState, ts: list[int], num: list[float], jv: list[str | None]) -> None:
    """Merge sorted new events into the sorted window (after equal times: arrival order)."""
    if not state.ts or ts[0] >= state.ts[-1]:
        state.ts, state.num, state.jv = state.ts + ts, state.num + num, state.jv + jv
        return
    t_all, n_all, j_all = state.ts[:], state.num[:], state.jv[:]
    for t, x, j in zip(ts, num, jv, strict=True):
        i = bisect_right(t_all, t)
        t_all.insert(i, t)
        n_all.insert(i, x)
        j_all.insert(i, j)
    state.ts, state.num, state.jv = t_all, n_all, j_all


def evict_window(state: VelocityState, rule: VelocityRule, horizon_ms: int) -> None:
    """Forget entries no future event can see: ts <= horizon - window."""
    i = bisect_right(state.ts, horizon_ms - rule.window_ms)
    if i:
        state.ts, state.num, state.jv = state.ts[i:], state.num[i:], state.jv[i:]


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
