"""Baseline: a single-process Python loop evaluating bench_backtest's rules and events.

The project's performance targets are stated against "a single-process Python loop
evaluating the same rules on the same events, detections equal". This is that loop: no
Spark, no JVM, one process, the rules of `bench_backtest.make_rules` (50 threshold +
10 velocity + 2 correlation) over the JSON Lines of `bench_backtest.make_events`.

    PYTHONPATH=. python tests/benchmarks/bench_python_loop.py [--events 1000000] [--keep DIR]
    PYTHONPATH=. python tests/benchmarks/bench_python_loop.py --events 200000 --keep DIR --check DIR/out

`--keep DIR` uses (or generates) DIR/events.jsonl, DIR/context.jsonl and DIR/rules, the
layout bench_backtest.py's `--keep DIR` writes, so the two benches can run on the same
files; bench_backtest.py then leaves the backtest's output in DIR/out. `--check OUT`
compares this loop's detections with OUT/detections.jsonl as sets of (rule_id,
detection_id) and prints "equal" or the differences (per rule, a few examples); where
both sides have a detection it also compares aggregation_value / metric_value.

What it does, in one process and one pass over the files:
* rules are loaded with the project's loader (spark_jobs.rules.loader.load_rules, what
  the backtest's load_rule_set calls) and the model's own window helpers (window_ms,
  lookback_ms);
* each line is `json.loads`-ed once; conditions are compiled to Python closures with
  the comparison semantics of docs/rule-language.md (dotted paths, null = missing, numeric strings
  compare as numbers, ordering on non-numbers never matches); identical velocity
  pre-filters are evaluated once per event;
* threshold rules are routed by the value of their most common `field == "string"`
  condition (here `type`), so an event is only tested against the rules of its type;
* velocity rules keep an incremental window per (rule, key): a deque of
  (time, value), evicted from the left as time moves (window = (t - W, t]); count is
  the deque's length, sum/avg a running sum (exact for the bench's integer amounts; with
  float values it could differ in the last bits from the engine's exactly rounded sum),
  min/max a monotonic deque, distinct_count a count per value (by JSON identity);
  `last_event` / `all_events` emit modes; processing-time rules read the
  backtest's default --time-field, `timestamp`;
* correlation rules: context.raw is read first (it is 0.6% of the records) into a
  time-sorted buffer per (rule, key); a primary at t finds its context in
  [t - lookback, t] by bisection, exactly the frame the backtest uses regardless of
  where context sits in the file. Resolution and judgement reuse the live job's pure
  Python functions `spark_jobs.streaming.keyed_logic.resolve` and `judge` (and
  `spark_jobs.engine.conditions.compare_json` for a `last` direct condition), so the
  metric arithmetic is the engine's own; a key's resolved context is cached while its
  frame (the pair of bisection indices) does not change.

Order: events are evaluated in file order, which for this data is event-time order
(ts = start + 3 * line). The velocity windows need each key's events in time order
(the backtest sorts by (time, arrival)); the loop checks this and stops with an error
rather than give different answers on unsorted input. Since all context is indexed
before the primaries are judged, no primary has to be held for late context: the
backtest also sees all context regardless of arrival order.

Timed: reading both files, json parsing, evaluating every rule and collecting the
detections into a list (rule setup and the --check comparison are outside). Python's
cyclic garbage collector is off in the timed region (`--with-gc` keeps it on): the loop
makes no reference cycles, and with ~0.9 detections per event kept in the list the
collector's repeated full scans cost ~30% more CPU at 1M events. Printed: machine,
events, wall seconds, events/s, process CPU seconds, detections per rule kind. The
machine is shared: compare process CPU seconds (and the load, `uptime`) more than wall.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import math
import operator
import os
import platform
import re
import sys
import time
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_backtest import prepare  # noqa: E402

from spark_jobs.engine.conditions import compare_json, rule_value_number  # noqa: E402
from spark_jobs.rules.loader import load_rules  # noqa: E402
from spark_jobs.rules.model import AnyRule, Condition, CorrelationRule, ThresholdRule, VelocityRule  # noqa: E402
from spark_jobs.streaming.keyed_logic import Resolved, Row, judge, resolve  # noqa: E402

# The engine's number and time conventions (spark_jobs.engine.values).
_NUMERIC = re.compile(r"^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$")
EPOCH_MS_CUTOFF = 1e11
MIN_EVENT_MS = -62_135_596_800_000
MAX_EVENT_MS = 253_402_300_799_999
_MISSING = object()
_SEP = "\u001f"

Event = dict[str, Any]
Getter = Callable[[Event], Any]
Test = Callable[[Event], bool]


@dataclass
class Detection:
    """One emit: the rule, the event's line (for the detection id), its parsed form and
    the rule kind's value (aggregation_value / metric_value)."""

    rule: AnyRule
    topic: str
    raw: str
    event: Event
    value: float | None = None


# --- values -------------------------------------------------------------------------


def getter(path: str) -> Getter:
    """Value at a dotted path; _MISSING when absent or JSON null."""
    parts = path.split(".")
    if len(parts) == 1:
        key = parts[0]

        def get1(e: Event) -> Any:
            v = e.get(key)
            return _MISSING if v is None else v

        return get1

    def get(e: Event) -> Any:
        v: Any = e
        for p in parts:
            if not isinstance(v, dict):
                return _MISSING
            v = v.get(p)
            if v is None:
                return _MISSING
        return v

    return get


def as_number(x: Any) -> float | None:
    """A JSON number or numeric string as a number (booleans are not numbers)."""
    t = type(x)
    if t is int or t is float:
        return x
    if t is str and _NUMERIC.match(x):
        return float(x)
    return None


def key_of(x: Any) -> Any:
    """A group/correlation key or distinct value by JSON value: 1 and "1" differ."""
    return x if type(x) is str else ("json", json.dumps(x, separators=(",", ":"), sort_keys=True))


def time_ms(x: Any) -> int | None:
    """Epoch ms of a timestamp value (values.timestamp_ms): numbers are ms above 1e11,
    else seconds; other strings ISO-8601 (UTC without an offset); None if unusable."""
    if x is _MISSING:
        return None
    n = as_number(x)
    if n is not None:
        ms = n if n > EPOCH_MS_CUTOFF else n * 1000.0
        return math.floor(ms) if MIN_EVENT_MS <= ms <= MAX_EVENT_MS else None
    if type(x) is not str:
        return None
    try:
        d = datetime.fromisoformat(x.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if d.tzinfo is None:
        d = d.replace(tzinfo=UTC)
    return (d - datetime(1970, 1, 1, tzinfo=UTC)) // _ONE_MS


_ONE_MS = datetime(1970, 1, 1, 0, 0, 0, 1000, tzinfo=UTC) - datetime(1970, 1, 1, tzinfo=UTC)


_CMP: dict[str, Callable[[Any, Any], bool]] = {
    "==": operator.eq, "!=": operator.ne, ">": operator.gt, "<": operator.lt, ">=": operator.ge, "<=": operator.le,
}
Pred = Callable[[Any], bool]


def value_test(op: str, value: object) -> Pred:
    """`x op value` on an extracted value x (_MISSING never matches), with
    conditions.compare's semantics: a number and a numeric string compare as numbers,
    ordering on non-numbers never matches, else `==`/`!=` compare JSON values."""
    num = rule_value_number(value)
    if num is not None:
        cmp = _CMP[op]
        if op == "!=":
            def ne_num(x: Any) -> bool:
                if x is _MISSING:
                    return False
                a = as_number(x)
                return a is None or a != num
            return ne_num

        def num_test(x: Any) -> bool:
            t = type(x)
            if t is int or t is float:
                return cmp(x, num)
            if x is _MISSING:
                return False
            a = as_number(x)
            return a is not None and cmp(a, num)
        return num_test
    if op not in ("==", "!="):
        return lambda x: False
    if isinstance(value, bool):
        def same(x: Any) -> bool:
            return x is value
    else:
        text = str(value)

        def same(x: Any) -> bool:
            return type(x) is str and x == text
    if op == "==":
        return lambda x: x is not _MISSING and same(x)
    return lambda x: x is not _MISSING and not same(x)


def compile_condition(c: Condition) -> Test:
    """`field operator value` on a parsed event."""
    get, pred = getter(c.field), value_test(c.operator, c.value)
    return lambda e: pred(get(e))


def cond_key(c: Condition) -> tuple:
    return c.field, c.operator, type(c.value).__name__, c.value


# --- threshold ----------------------------------------------------------------------


@dataclass
class ThresholdIndex:
    """Threshold rules of one topic, routed by one field's value. A rule's other
    conditions are (path index, predicate) over the paths read once per event."""

    route_field: str | None
    paths: list[str]
    routed: dict[str, list[tuple[ThresholdRule, list[tuple[int, Pred]]]]]
    always: list[tuple[ThresholdRule, list[tuple[int, Pred]]]]

    @classmethod
    def build(cls, rules: list[ThresholdRule]) -> ThresholdIndex:
        def routable(c: Condition) -> bool:
            return c.operator == "==" and isinstance(c.value, str) and rule_value_number(c.value) is None

        fields = Counter(c.field for r in rules for c in r.conditions if routable(c))
        route = fields.most_common(1)[0][0] if fields else None
        paths: dict[str, int] = {}
        routed: dict[str, list] = defaultdict(list)
        always = []
        for r in rules:
            on = next((c for c in r.conditions if c.field == route and routable(c)), None)
            rest = [(paths.setdefault(c.field, len(paths)), value_test(c.operator, c.value))
                    for c in r.conditions if c is not on]
            if on is None:
                always.append((r, rest))
            else:
                routed[str(on.value)].append((r, rest))
        return cls(route, list(paths), dict(routed), always)


# --- velocity -----------------------------------------------------------------------


@dataclass
class Window:
    """One (rule, key) window: (ts, value) in time order, aggregates kept as values
    enter and leave."""

    items: deque = field(default_factory=deque)
    total: float = 0
    ext: deque | None = None  # min/max: monotonic (ts, value)
    counts: dict[Any, int] | None = None  # distinct_count: value -> occurrences
    prev_above: bool = False


@dataclass
class VelocityPlan:
    rule: VelocityRule
    filter_id: int  # index of its (shared) pre-filter
    key: Getter | None
    value: Getter | None
    window_ms: int
    threshold: float
    every: bool
    routes_to: list[CorrelationPlan]
    key_idx: int = -1  # where its group value, value and time are in the event's extracted fields
    value_idx: int = -1
    time_idx: int = -1
    windows: dict[Any, Window] = field(default_factory=dict)
    kind: str = ""

    def __post_init__(self) -> None:
        self.kind = self.rule.aggregation_type

    def step(self, k: Any, x: Any, t: int) -> float | None:
        """Take the event (its group value `k`, aggregation value `x`, time `t`; "" and
        None where the rule has none) into its key's window; the aggregate if it emits."""
        if k is _MISSING or x is _MISSING:
            return None
        if self.key is not None:
            k = key_of(k)
        kind = self.kind
        if self.value is not None:
            if kind == "distinct_count":
                x = key_of(x)
            elif kind != "count":
                x = as_number(x)
                if x is None:
                    return None
        w = self.windows.get(k)
        if w is None:
            w = self.windows[k] = Window()
        items = w.items
        if items and t < items[-1][0]:
            raise SystemExit(f"{self.rule.rule_id}: key {k!r} goes back in time ({t} after {items[-1][0]}); "
                             "this loop needs each key's events in time order")
        lo = t - self.window_ms
        if items and items[-1][0] <= lo:
            w.prev_above = False  # the window had emptied: a new episode (README, last_event)
        if kind == "count":
            while items and items[0][0] <= lo:
                items.popleft()
            items.append((t, None))
            agg = float(len(items))
        elif kind in ("sum", "avg"):
            while items and items[0][0] <= lo:
                w.total -= items.popleft()[1]
            items.append((t, x))
            w.total += x
            agg = float(w.total) if kind == "sum" else w.total / len(items)
        elif kind == "distinct_count":
            counts = w.counts
            if counts is None:
                counts = w.counts = {}
            while items and items[0][0] <= lo:
                old = items.popleft()[1]
                n = counts[old] - 1
                if n:
                    counts[old] = n
                else:
                    del counts[old]
            items.append((t, x))
            counts[x] = counts.get(x, 0) + 1
            agg = float(len(counts))
        else:  # min / max: the deque front is the extreme of the window
            ext = w.ext
            if ext is None:
                ext = w.ext = deque()
            while ext and ext[0][0] <= lo:
                ext.popleft()
            if kind == "max":
                while ext and ext[-1][1] <= x:
                    ext.pop()
            else:
                while ext and ext[-1][1] >= x:
                    ext.pop()
            ext.append((t, x))
            items.append((t, None))  # only for the time-order check
            if len(items) > 1:
                items.popleft()
            agg = float(ext[0][1])
        above = agg >= self.threshold
        fire = above and (self.every or not w.prev_above)
        w.prev_above = above
        return agg if fire else None


# --- correlation --------------------------------------------------------------------


@dataclass
class CorrelationPlan:
    rule: CorrelationRule
    key: Getter
    time: Getter
    event_value: Getter | None
    lookback_ms: int
    context: dict[Any, tuple[list[int], list[Row]]] = field(default_factory=dict)
    cache: dict[Any, tuple[int, int, Resolved | None]] = field(default_factory=dict)

    def direct_match(self, ctx_json: str | None) -> bool:
        return compare_json(ctx_json, self.rule.condition.operator, self.rule.condition.value)

    def add_context(self, e: Event, raw: str, seq: int, ctx_filter: Test | None, value: Getter) -> None:
        if ctx_filter is not None and not ctx_filter(e):
            return
        k = self.key(e)
        t = time_ms(self.time(e))
        v = value(e)
        if k is _MISSING or t is None or v is _MISSING:
            return
        num = as_number(v)
        if num is None and (self.rule.context_resolution != "last" or self.rule.metric != "direct"):
            return
        jv = json.dumps(v, separators=(",", ":"))
        times, rows = self.context.setdefault(key_of(k), ([], []))
        times.append(t)
        rows.append(Row(t, seq, None if num is None else float(num), jv, raw, "ctx"))

    def sort_context(self) -> None:
        for k, (times, rows) in self.context.items():
            if any(b < a for a, b in zip(times, times[1:], strict=False)):
                rows.sort(key=lambda r: (r.ts, r.seq))
                self.context[k] = ([r.ts for r in rows], rows)

    def judge(self, e: Event, raw: str, seq: int, topic: str) -> tuple[float | None] | None:
        """(metric_value,) if the primary matches, else None."""
        k = self.key(e)
        if k is _MISSING:
            return None
        t = time_ms(self.time(e))
        if t is None:
            return None  # a dead letter in the engine
        ck = key_of(k)
        ctx = self.context.get(ck)
        if ctx is None:
            return None
        times, rows = ctx
        lo, hi = bisect_left(times, t - self.lookback_ms), bisect_right(times, t)
        cached = self.cache.get(ck)
        if cached is not None and cached[0] == lo and cached[1] == hi:
            resolved = cached[2]
        else:
            resolved = resolve(self.rule, rows[lo:hi], t) if hi > lo else None
            self.cache[ck] = (lo, hi, resolved)
        if resolved is None:
            return None
        ev = None
        if self.event_value is not None:
            x = self.event_value(e)
            ev = None if x is _MISSING else as_number(x)
        primary = Row(t, seq, None if ev is None else float(ev), None, raw, topic)
        emit = judge(self.rule, primary, resolved, self.direct_match)
        return None if emit is None else (emit.metric_value,)


# --- the loop -----------------------------------------------------------------------


@dataclass
class Engine:
    rules: list[AnyRule]
    time_field: str = "timestamp"  # processing-time rules on file input (BacktestConfig)
    dead_letters: int = 0

    def __post_init__(self) -> None:
        rules = [r for r in self.rules if r.enabled]
        self.threshold: dict[str, ThresholdIndex] = {}
        for topic in {r.source_topic for r in rules if isinstance(r, ThresholdRule)}:
            self.threshold[topic] = ThresholdIndex.build(
                [r for r in rules if isinstance(r, ThresholdRule) and r.source_topic == topic])
        self.correlation: list[CorrelationPlan] = []
        self.ctx_readers: dict[str, list[tuple[CorrelationPlan, Test | None, Getter]]] = defaultdict(list)
        self.primaries: dict[str, list[CorrelationPlan]] = defaultdict(list)
        by_velocity: dict[str, list[CorrelationPlan]] = defaultdict(list)
        for r in rules:
            if isinstance(r, CorrelationRule):
                p = CorrelationPlan(r, getter(r.correlation_key), getter(r.timestamp_field),
                                    getter(r.event_value_field) if r.event_value_field else None, r.lookback_ms)
                self.correlation.append(p)
                ctf = None
                if r.context_type_field is not None:
                    ctf = compile_condition(Condition(field=r.context_type_field, operator="==",
                                                      value=r.context_type_value))
                self.ctx_readers[r.context_topic].append((p, ctf, getter(r.context_value_field)))
                if r.velocity_filter_rule_id:
                    by_velocity[r.velocity_filter_rule_id].append(p)
                else:
                    self.primaries[r.source_topic].append(p)
        self.filters: dict[str, list[list[Test]]] = defaultdict(list)  # topic -> distinct pre-filters
        self.velocity: dict[str, list[VelocityPlan]] = defaultdict(list)
        seen: dict[tuple, int] = {}
        for r in rules:
            if not isinstance(r, VelocityRule):
                continue
            fk = (r.source_topic, tuple(cond_key(c) for c in r.conditions))
            if fk not in seen:
                seen[fk] = len(self.filters[r.source_topic])
                self.filters[r.source_topic].append([compile_condition(c) for c in r.conditions])
            self.velocity[r.source_topic].append(VelocityPlan(
                r, seen[fk], getter(r.group_by) if r.group_by else None,
                getter(r.aggregation_field) if r.aggregation_field else None,
                r.window_ms, float(r.threshold), r.emit_mode == "all_events",
                [] if r.emit_to_sink else by_velocity.get(r.rule_id, [])))
        # Each path the velocity rules of a topic read is read once per event.
        self.velocity_fields: dict[str, tuple[list[Getter], list[int]]] = {}
        for topic, plans in self.velocity.items():
            paths: dict[str, int] = {}
            times: dict[str, int] = {}

            def index(path: str | None, paths: dict[str, int] = paths) -> int:
                return -1 if path is None else paths.setdefault(path, len(paths))

            for v in plans:
                r = v.rule
                v.key_idx, v.value_idx = index(r.group_by), index(r.aggregation_field)
                tf = r.timestamp_field if r.uses_event_time and r.timestamp_field else self.time_field
                v.time_idx = times.setdefault(tf, len(times))
                index(tf)
            self.velocity_fields[topic] = ([getter(p) for p in paths], [paths[p] for p in times])

    def run(self, inputs: list[tuple[str, Path]]) -> list[Detection]:
        out: list[Detection] = []
        seq = 0
        # Context first: each correlation rule indexes its context per key.
        for topic, path in inputs:
            readers = self.ctx_readers.get(topic)
            if not readers:
                continue
            with path.open() as f:
                for line in f:
                    if not line.strip():
                        continue
                    seq += 1
                    try:
                        e = json.loads(line)
                    except ValueError:
                        continue
                    if type(e) is not dict:
                        continue
                    raw = line.rstrip("\r\n")
                    for plan, ctf, value in readers:
                        plan.add_context(e, raw, seq, ctf, value)
        for plan in self.correlation:
            plan.sort_context()
        for topic, path in inputs:
            self._run_topic(topic, path, seq, out)
        return out

    def _run_topic(self, topic: str, path: Path, seq: int, out: list[Detection]) -> None:
        th = self.threshold.get(topic)
        route_get = getter(th.route_field) if th and th.route_field else None
        routed = th.routed if th else {}
        always = th.always if th else []
        th_getters = [getter(p) for p in th.paths] if th else []
        filters = self.filters.get(topic, [])
        velocity = self.velocity.get(topic, [])
        getters, time_idx = self.velocity_fields.get(topic, ([], []))
        primaries = self.primaries.get(topic, [])
        if not (th or velocity or primaries):
            return
        append = out.append
        with path.open() as f:
            for line in f:
                seq += 1
                try:
                    e = json.loads(line)
                except ValueError:
                    if line.strip():
                        self.dead_letters += 1
                    continue
                if type(e) is not dict:
                    self.dead_letters += 1
                    continue
                raw = line.rstrip("\r\n")
                if th is not None:
                    tvals = [g(e) for g in th_getters]
                    if route_get is not None:
                        rv = route_get(e)
                        for rule, tests in (routed.get(rv, ()) if type(rv) is str else ()):
                            for i, pred in tests:
                                if not pred(tvals[i]):
                                    break
                            else:
                                append(Detection(rule, topic, raw, e))
                    for rule, tests in always:
                        if all(pred(tvals[i]) for i, pred in tests):
                            append(Detection(rule, topic, raw, e))
                if velocity:
                    passed = [all(test(e) for test in tests) for tests in filters]
                    if any(passed):
                        vals = [g(e) for g in getters]
                        times = [time_ms(vals[i]) for i in time_idx]
                    for v in velocity:
                        if not passed[v.filter_id]:
                            continue
                        t = times[v.time_idx]
                        if t is None:
                            self.dead_letters += 1
                            continue
                        agg = v.step(vals[v.key_idx] if v.key_idx >= 0 else "",
                                     vals[v.value_idx] if v.value_idx >= 0 else None, t)
                        if agg is None:
                            continue
                        if v.rule.emit_to_sink:
                            append(Detection(v.rule, topic, raw, e, agg))
                        for plan in v.routes_to:
                            m = plan.judge(e, raw, seq, topic)
                            if m is not None:
                                append(Detection(plan.rule, topic, raw, e, m[0]))
                for plan in primaries:
                    m = plan.judge(e, raw, seq, topic)
                    if m is not None:
                        append(Detection(plan.rule, topic, raw, e, m[0]))


# --- check --------------------------------------------------------------------------


def detection_id(d: Detection) -> str:
    """The engine's detection_id (engine/detections.py): sha256 of rule id, version,
    topic and the event text joined by U+001F, first 32 hex digits."""
    text = _SEP.join([d.rule.rule_id, d.rule.version, d.topic, d.raw])
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def check(dets: list[Detection], out_dir: Path) -> bool:
    """Compare with a backtest's detections.jsonl as sets of (rule_id, detection_id)."""
    mine: dict[tuple[str, str], Detection] = {(d.rule.rule_id, detection_id(d)): d for d in dets}
    theirs: dict[tuple[str, str], dict] = {}
    with (out_dir / "detections.jsonl").open() as f:
        for line in f:
            rec = json.loads(line)
            theirs[(rec["rule_id"], rec["detection_id"])] = rec
    only_mine = sorted(set(mine) - set(theirs))
    only_theirs = sorted(set(theirs) - set(mine))
    value_diff = []
    for k in set(mine) & set(theirs):
        rec = theirs[k]
        ref = rec.get("aggregation_value", rec.get("metric_value"))
        v = mine[k].value
        if (ref is None) != (v is None) or (v is not None and not math.isclose(v, ref, rel_tol=1e-12, abs_tol=1e-12)):
            value_diff.append((k, v, ref))
    print(f"check against {out_dir / 'detections.jsonl'}: loop {len(mine)} (list {len(dets)}), "
          f"backtest {len(theirs)}, common {len(set(mine) & set(theirs))}")
    if len(mine) != len(dets):
        print(f"  the loop emitted {len(dets) - len(mine)} duplicate (rule, detection_id) pairs")
    if not only_mine and not only_theirs and not value_diff and len(mine) == len(dets):
        print("detections: EQUAL (same (rule_id, detection_id) set; aggregation/metric values equal)")
        return True
    for name, keys, side in (("only in loop", only_mine, mine), ("only in backtest", only_theirs, theirs)):
        if not keys:
            continue
        print(f"{name}: {len(keys)}; per rule: {dict(Counter(r for r, _ in keys).most_common())}")
        for k in keys[:5]:
            d = side[k]
            ev = d.event if isinstance(d, Detection) else {x: y for x, y in d.items() if x not in ("processed",)}
            print(f"    {k[0]} {k[1]} {json.dumps(ev)[:300]}")
    if value_diff:
        print(f"value differences: {len(value_diff)}; per rule: {dict(Counter(k[0] for k, _, _ in value_diff))}")
        for k, v, ref in value_diff[:5]:
            print(f"    {k[0]} {k[1]} loop {v!r} backtest {ref!r}")
    print("detections: DIFFERENT")
    return False


def load_rule_set(rules_dir: Path) -> list[AnyRule]:
    """What the backtest's load_rule_set does, without importing pyspark."""
    loaded = load_rules([rules_dir])
    if loaded.errors:
        raise SystemExit("\n".join(str(e) for e in loaded.errors))
    return [lr.rule for lr in loaded.rules]


def timed_run(engine: Engine, inputs: list[tuple[str, Path]], with_gc: bool = False
              ) -> tuple[list[Detection], float, float]:
    """The loop over `inputs`: (detections, wall seconds, process CPU seconds). The
    cyclic collector is off unless `with_gc` (see --with-gc)."""
    if not with_gc:
        gc.disable()
    try:
        t, cpu = time.perf_counter(), time.process_time()
        dets = engine.run(inputs)
        return dets, time.perf_counter() - t, time.process_time() - cpu
    finally:
        gc.enable()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keep", type=Path, help="use/generate the files in DIR (bench_backtest.py --keep layout)")
    ap.add_argument("--check", type=Path, metavar="OUT", help="compare with OUT/detections.jsonl of a backtest")
    ap.add_argument("--with-gc", action="store_true",
                    help="keep Python's cyclic garbage collector on in the timed region (off by default: the "
                         "loop makes no cycles, and the collector rescans every kept detection again and again)")
    args = ap.parse_args()

    work, ev, ctx = prepare(args.keep, args.events, "bench-python-loop-")
    with ev.open("rb") as fh:
        n_events = sum(1 for _ in fh)
    if n_events != args.events:
        print(f"note: {ev} holds {n_events} events (not --events {args.events})")
    rules = load_rule_set(work / "rules")
    engine = Engine(rules)

    dets, elapsed, cpu = timed_run(engine, [("events.raw", ev), ("context.raw", ctx)], args.with_gc)

    kinds = Counter(d.rule.rule_type for d in dets)
    print(f"machine: {platform.machine()} {platform.system()} {os.cpu_count()} cores, "
          f"python {platform.python_version()} ({platform.python_implementation()}), one process")
    print(f"rules: 50 threshold + 10 velocity + 2 correlation; detections: {len(dets)} "
          f"(threshold {kinds['threshold']}, velocity {kinds['velocity']}, correlation {kinds['correlation']}); "
          f"dead letters {engine.dead_letters}")
    print(f"python loop over {n_events} events: {elapsed:.1f}s -> {n_events / elapsed:,.0f} events/s "
          f"(process CPU {cpu:.1f}s, cyclic GC {'on' if args.with_gc else 'off'})")
    if args.check:
        ok = check(dets, args.check)
        sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
