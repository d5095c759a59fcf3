"""The baseline the platform's throughput is measured against: the same rules over the
same records in one plain Python process, written as a competent engineer would write
it for speed, not as an oracle.

    python tests/benchmarks/python_loop.py --rules DIR --input TOPIC=FILE [--input ...] [--time-field ts]

- each record is parsed once (`json.loads`);
- threshold and velocity rules are indexed by an `==` condition on a text value (path,
  value) -> rules, so an event meets only the rules that could match it
  (the discrimination index the platform's evaluator has too);
- velocity windows slide in O(1) amortized per entered event (running sum and count,
  monotonic deques for min and max, value counts for distinct_count), per (rule, key) in
  the backtest's order (time, then arrival);
- correlation context is kept per key sorted by time, a primary's lookback found by
  bisection.

Values, comparisons and times follow the rule language through tests/reference_engine.py's
helpers, so the loop's detections can be held equal to the platform's: the figures are
comparable only when they are. Sums are float sums, exact for the benchmarks' whole-number
amounts.
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
import time
from collections import Counter, defaultdict, deque
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[2])]
from reference_engine import (  # noqa: E402
    RefEvent,
    _ContextRecord,
    _correlate_one,
    compare,
    get_path,
    json_key,
    parse_event,
    parse_number,
    parse_timestamp_ms,
)

from spark_jobs.rules.loader import load_rules  # noqa: E402
from spark_jobs.rules.model import AnyRule, CorrelationRule, ThresholdRule, VelocityRule  # noqa: E402


def _holds(obj: dict, conditions: list) -> bool:
    for c in conditions:
        a = get_path(obj, c.field)
        b = c.value
        if type(a) in (int, float) and type(b) in (int, float):  # the common case, without the general path
            op = c.operator
            if not (a == b if op == "==" else a != b if op == "!=" else a > b if op == ">" else a < b if op == "<"
                    else a >= b if op == ">=" else a <= b):
                return False
        elif not compare(a, c.operator, b):
            return False
    return True


class _Index:
    """Rules of one topic (threshold or velocity), indexed by one `==` condition on a
    text: `candidates` are the rules an event could enter, `matching` those whose
    conditions it passes."""

    def __init__(self, rules: list) -> None:
        self.by_value: dict[tuple[str, str], list] = defaultdict(list)
        self.paths: list[str] = []
        self.rest: list = []
        def texts(r: Any) -> list:
            return [c for c in r.conditions if c.operator == "==" and isinstance(c.value, str)
                    and parse_number(c.value) is None]

        # Each rule goes under its most telling condition: the path the rules ask the
        # most different values of (`user_id` before `type`).
        values: dict[str, set[str]] = defaultdict(set)
        for r in rules:
            for c in texts(r):
                values[c.field].add(c.value)
        for r in rules:
            eq = max(texts(r), key=lambda c: len(values[c.field]), default=None)
            if eq is None:
                self.rest.append(r)
                continue
            if eq.field not in self.paths:
                self.paths.append(eq.field)
            self.by_value[(eq.field, eq.value)].append(r)

    def candidates(self, obj: dict) -> list:
        out = list(self.rest)
        for path in self.paths:
            value = get_path(obj, path)
            if isinstance(value, str):
                out += self.by_value.get((path, value), ())
        return out

    def matching(self, obj: dict) -> list:
        return [r for r in self.candidates(obj) if _holds(obj, r.conditions)]


def _entered(rule: VelocityRule, ev: RefEvent, obj: dict) -> tuple[Any, int, Any] | None:
    """(key, time, value) where the event, which passes the rule's conditions, enters
    its window, else None."""
    key: Any = ""
    if rule.group_by is not None:
        g = get_path(obj, rule.group_by)
        if g is None:
            return None
        key = (True, g) if isinstance(g, str) else (False, json_key(g))  # 1 and "1" differ
    ts = (parse_timestamp_ms(get_path(obj, rule.timestamp_field)) if rule.uses_event_time
          else ev.proc_ts_ms)
    if ts is None:
        return None
    value: Any = None
    if rule.aggregation_field is not None:
        raw = get_path(obj, rule.aggregation_field)
        if raw is None:
            return None
        if rule.aggregation_type == "distinct_count":
            value = json_key(raw)
        elif rule.aggregation_type != "count":
            value = parse_number(raw)
            if value is None:
                return None
    return key, ts, value


def _slide(rule: VelocityRule, entries: list[tuple[int, int, Any, RefEvent, dict]]) -> list[tuple[RefEvent, dict]]:
    """The events of one key (sorted by time, arrival) at which the rule fires."""
    kind, size, threshold = rule.aggregation_type, rule.window_ms, rule.threshold
    window: deque = deque()
    total = 0.0
    lows: deque = deque()
    highs: deque = deque()
    counts: Counter = Counter()
    previous: float | None = None
    fired = []
    for entry in entries:
        ts, _, value, ev, obj = entry
        window.append(entry)
        if kind in ("sum", "avg"):
            total += value
        elif kind == "min":
            while lows and lows[-1][2] > value:
                lows.pop()
            lows.append(entry)
        elif kind == "max":
            while highs and highs[-1][2] < value:
                highs.pop()
            highs.append(entry)
        elif kind == "distinct_count":
            counts[value] += 1
        while window[0][0] <= ts - size:
            old = window.popleft()
            if kind in ("sum", "avg"):
                total -= old[2]
            elif kind == "min" and lows[0] is old:
                lows.popleft()
            elif kind == "max" and highs[0] is old:
                highs.popleft()
            elif kind == "distinct_count":
                counts[old[2]] -= 1
                if not counts[old[2]]:
                    del counts[old[2]]
        n = len(window)
        agg = (float(n) if kind == "count" else total if kind == "sum" else total / n if kind == "avg"
               else lows[0][2] if kind == "min" else highs[0][2] if kind == "max" else float(len(counts)))
        if n == 1:
            previous = None  # the window had emptied: a new episode
        above = agg >= threshold
        if above and (rule.emit_mode == "all_events" or previous is None or previous < threshold):
            fired.append((ev, obj))
        previous = agg
    return fired


def evaluate(rules: list[AnyRule], records: list[tuple[str, str]], time_field: str) -> Counter:
    """Detections per rule id of the enabled `rules` over `records` ((topic, text), in
    arrival order); a record's processing time is its `time_field`, as the backtest's
    for a file."""
    rules = [r for r in rules if r.enabled]
    by_topic: dict[str, list[AnyRule]] = defaultdict(list)
    for r in rules:
        by_topic[r.source_topic].append(r)
    thresholds = {t: _Index([r for r in rs if isinstance(r, ThresholdRule)]) for t, rs in by_topic.items()}
    velocity = {t: _Index([r for r in rs if isinstance(r, VelocityRule)]) for t, rs in by_topic.items()}
    proc_time = {r.source_topic for r in rules if isinstance(r, VelocityRule) and not r.uses_event_time}
    correlation = [r for r in rules if isinstance(r, CorrelationRule)]
    context_topics = {r.context_topic for r in correlation}
    source_topics = {r.source_topic for r in correlation}
    windows: dict[tuple[str, Any], list] = defaultdict(list)
    sources: dict[str, list[tuple[RefEvent, dict]]] = defaultdict(list)  # correlation source topic -> events
    contexts: dict[str, list[tuple[RefEvent, dict]]] = defaultdict(list)
    found: Counter = Counter()

    for seq, (t, raw) in enumerate(records):
        obj = parse_event(raw)
        if obj is None:
            continue
        ev = RefEvent(t, raw, seq, parse_timestamp_ms(get_path(obj, time_field)) if t in proc_time else None)
        if t in thresholds:
            for r in thresholds[t].matching(obj):
                found[r.rule_id] += 1
        for r in velocity[t].matching(obj) if t in velocity else ():
            e = _entered(r, ev, obj)
            if e is not None:
                windows[(r.rule_id, e[0])].append((e[1], seq, e[2], ev, obj))
        if t in context_topics:
            contexts[t].append((ev, obj))
        if t in source_topics:
            sources[t].append((ev, obj))

    by_id = {r.rule_id: r for r in rules}
    routed: dict[str, list[tuple[RefEvent, dict]]] = defaultdict(list)
    for (rid, _), entries in windows.items():
        rule = by_id[rid]
        entries.sort(key=lambda x: (x[0], x[1]))
        fired = _slide(rule, entries)
        if rule.emit_to_sink:
            found[rid] += len(fired)
        else:
            routed[rid] += fired

    for rule in correlation:
        per_key: dict[str, list] = defaultdict(list)
        for ev, obj in contexts[rule.context_topic]:
            k = get_path(obj, rule.correlation_key)
            ts = parse_timestamp_ms(get_path(obj, rule.timestamp_field))
            value = get_path(obj, rule.context_value_field)
            if k is None or ts is None or value is None:
                continue
            if rule.context_type_field is not None and not compare(
                    get_path(obj, rule.context_type_field), "==", rule.context_type_value):
                continue
            per_key[json_key(k)].append(_ContextRecord(json_key(k), ts, ev.seq, value))
        times = {}
        for k, cs in per_key.items():
            cs.sort(key=lambda c: (c.ts, c.seq))
            times[k] = [c.ts for c in cs]
        primaries = (sorted(routed[rule.velocity_filter_rule_id], key=lambda x: x[0].seq)
                     if rule.velocity_filter_rule_id else sources[rule.source_topic])
        for ev, obj in primaries:
            k, ts = get_path(obj, rule.correlation_key), parse_timestamp_ms(get_path(obj, rule.timestamp_field))
            if k is None or ts is None or json_key(k) not in per_key:
                continue
            key = json_key(k)
            lo = bisect.bisect_left(times[key], ts - rule.lookback_ms)
            hi = bisect.bisect_right(times[key], ts)
            if lo < hi and _correlate_one(rule, ev, obj, per_key[key][lo:hi]) is not None:
                found[rule.rule_id] += 1
    return found


def run(rules_dir: Path, inputs: list[tuple[str, Path]], time_field: str = "timestamp") -> tuple[float, Counter]:
    """(seconds, detections per rule): the files read in the backtest's arrival order
    (file by file, line by line) and evaluated; the clock starts before the read."""
    rules = [lr.rule for lr in load_rules([rules_dir]).rules]
    started = time.perf_counter()
    records: list[tuple[str, str]] = []
    for topic, path in inputs:
        with path.open() as f:
            records += [(topic, line.rstrip("\n")) for line in f]
    found = evaluate(rules, records, time_field)
    return time.perf_counter() - started, found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rules", type=Path, required=True)
    ap.add_argument("--input", action="append", required=True, help="TOPIC=FILE (JSON Lines)")
    ap.add_argument("--time-field", default="timestamp")
    args = ap.parse_args()
    inputs = [(t, Path(p)) for t, p in (x.split("=", 1) for x in args.input)]
    seconds, found = run(args.rules, inputs, args.time_field)
    print(json.dumps({"seconds": round(seconds, 2), "detections": sum(found.values()), "by_rule": dict(found)}))


if __name__ == "__main__":
    main()
