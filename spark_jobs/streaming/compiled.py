"""The rule set in force, compiled into the live plan: one row per (event, rule it concerns).

Rules used to reach the query as data (a broadcast join of every event with every rule
of its topic, each condition interpreted from the rule's row). That cost 55-67 us of
JVM time per event (tests/benchmarks/bench_live_plan.py): a generic comparison per
(event, rule) row, and a plan of 100k+ characters that Spark optimizes again at every
micro-batch (about 1 s per branch against a 500 ms trigger).

Here each rule's conditions are literal expressions built by the engine's own
`compare_spec` (the backtest's), so Spark generates plain code for them: an event is
tested against every rule of the set in one projection, and only the (event, rule)
pairs that pass become rows. The price is that a rule change means a new plan: the job
restarts its query in-process on the same checkpoint (same query id, state kept) when
the registry's snapshot changes (job.py `run`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.engine.conditions import compare_spec
from spark_jobs.engine.values import FieldValue, extract_paths
from spark_jobs.rules.model import parse_rule
from spark_jobs.streaming.rules_source import Cond, RuleRow, rule_rows


def rows_of(rules: dict, routed_topic: str, defs_dir: str | Path | None) -> list[RuleRow]:
    """The RuleRows of a registry snapshot (`rules.json`: rule id -> rule JSON)."""
    return [row for d in rules.values() for row in rule_rows(parse_rule(d), routed_topic, defs_dir)]


def read_snapshot(path: Path) -> str:
    """The registry's snapshot text (`{}` before the first write)."""
    return path.read_text() if path.exists() else "{}"


_ORDERING = ("<", ">", "<=", ">=")


def _and(cols: Sequence[Column]) -> Column:
    out = F.lit(True)
    for c in cols:
        out = out & c
    return out


def _or(cols: Sequence[Column]) -> Column:
    out = F.lit(False)
    for c in cols:
        out = out | c
    return out


def _routes(c: Cond, path: str) -> bool:
    return c.path == path and c.op == "==" and c.kind == "str"


def _route_path(members: Sequence[tuple[int, RuleRow]]) -> str | None:
    """The path most rules test for equality with a string, if at least two do."""
    counts: dict[str, int] = {}
    for _, r in members:
        for p in {c.path for c in r.conditions if c.op == "==" and c.kind == "str"}:
            counts[p] = counts.get(p, 0) + 1
    best = max(counts.items(), key=lambda kv: (kv[1], kv[0]), default=None)
    return best[0] if best and best[1] >= 2 else None


def _by_rule(i: Column, rows: Sequence[RuleRow], value: Callable[[RuleRow], Column | None]) -> Column:
    """CASE over the rule index `i` of each row's `value` (NULL where it is None); rows
    with the same value (by its string form: the same path) share one branch."""
    groups: dict[str, tuple[Column, list[int]]] = {}
    for n, r in enumerate(rows):
        c = value(r)
        if c is not None:
            groups.setdefault(str(c), (c, []))[1].append(n)
    out: Column | None = None
    for c, idx in groups.values():
        test = i.isin(*idx) if len(idx) > 1 else i == F.lit(idx[0])
        out = F.when(test, c) if out is None else out.when(test, c)
    return out if out is not None else F.lit(None)


def _pick(i: Column, values: Sequence[object], type_: str) -> Column:
    """values[i] for a per-rule constant: a literal array, folded once by the optimizer.

    try_element_at, not element_at: in Spark 4.2 the generated code of
    `element_at(<literal array>, NULL)` returns the array's last element instead of NULL
    (a record that is no event, which has no rule index, came out as a detection).
    """
    if not values:
        return F.lit(None).cast(type_)
    return F.try_element_at(F.array(*[F.lit(x).cast(type_) for x in values]), i + F.lit(1))


def fan_out(events: DataFrame, rows: Sequence[RuleRow], keep_malformed: bool = False,
            max_ahead_ms: int = 5_000) -> DataFrame:
    """One row per (event, rule row whose conditions it passes), with the rule's key,
    event time and value read from the event; and per (event, rule row) a row with
    `_skip` set when only a value the rule cannot read (a non-number compared with an
    ordering operator) kept it from passing, to be counted and dropped.

    `keep_malformed`: each record that is not an event comes through once, with no
    rule (rule columns NULL, `_reason` set), to be a dead letter: one scan serves both.
    """
    needs: dict[str, set[str]] = {}
    for r in rows:
        for c in r.conditions:
            needs.setdefault(c.path, set()).add({"num": "num", "bool": "json"}.get(c.kind, "str"))
        if r.key_path:
            needs.setdefault(r.key_path, set()).add("json")
        if r.val_path:
            needs.setdefault(r.val_path, set()).update(("num", "json"))
    # Each path read once per event, in staged projections (values.extract_paths),
    # whatever number of rules read it.
    events, fields = extract_paths(events, needs, {r.ts_path for r in rows if r.ts_path}, to_json_path=str)

    def fv(p: str) -> FieldValue:
        return fields.value(p)

    def unreadable(c: Cond) -> Column | None:
        if c.kind != "num" or c.op not in _ORDERING:
            return None
        x = fields.value(c.path)
        return x.present & x.num.isNull()

    def ok(c: Cond) -> Column:
        return compare_spec(fv(c.path), c.op, c.kind, c.num, c.str, c.flag)

    def blocked(r: RuleRow) -> Column:
        # Only when every other condition passes: an event that fails the rule anyway
        # was not kept from firing by the unreadable value.
        oks = [ok(c) for c in r.conditions]
        return ~_and(oks) & _and([o | u if (u := unreadable(c)) is not None else o
                                  for o, c in zip(oks, r.conditions, strict=True)])

    def matches_of(members: list[tuple[int, RuleRow]]) -> Column:
        """The indexes ("0,s3,7") of the rules of one source (topic, routed-from) an
        event passes ("s": kept from passing only by an unreadable value).

        Routed like the Ververica demo, but in the plan: the rules that test one path
        for equality with a string (an event type) are grouped by that string, and a
        CASE on the event's value picks the group, so an event is tested against the
        rules of its type only (4 comparisons, not 50, for the bench's rules).
        """
        route = _route_path(members)
        routed: dict[str, list[tuple[int, RuleRow, list[Cond]]]] = {}
        flags: list[Column] = []
        for n, r in members:
            eq = next((c for c in r.conditions if route and _routes(c, route)), None)
            if eq is None:
                flags.append(F.when(_and([ok(c) for c in r.conditions]), F.lit(str(n))))
            else:
                rest = [c for c in r.conditions if c is not eq]
                routed.setdefault(eq.str or "", []).append((n, r, rest))
        if routed:
            value = fv(route).str
            case: Column | None = None
            for text, group in routed.items():
                part = F.concat_ws(",", *[F.when(_and([ok(c) for c in rest]), F.lit(str(n))) for n, _, rest in group])
                case = F.when(value == F.lit(text), part) if case is None else case.when(value == F.lit(text), part)
            flags.insert(0, case)
        # Unreadable values are looked for once per event; the rules' blocked tests run
        # only for an event that has one.
        checks = {c.path: u for _, r in members for c in r.conditions if (u := unreadable(c)) is not None}
        if checks:
            any_unread = _or(list(checks.values()))
            skips = [F.when(blocked(r), F.lit(f"s{n}")) for n, r in members
                     if any(unreadable(c) is not None for c in r.conditions)]
            flags.append(F.when(any_unread, F.concat_ws(",", *skips)))
        return F.concat_ws(",", *flags)

    sources: dict[tuple[str, str | None], list[tuple[int, RuleRow]]] = {}
    for n, r in enumerate(rows):
        sources.setdefault((r.topic, r.route_from), []).append((n, r))
    # The indexes as text: concat_ws skips NULLs in generated code, where an array
    # compacted by a higher-order function is evaluated interpreted (emits.matching).
    matches: Column = F.lit("")
    if sources:
        case = None
        for (topic, route_from), members in sources.items():
            mine = F.col("in_topic") == F.lit(topic)
            if route_from is not None:
                mine = mine & (F.col("route_from") == F.lit(route_from))
            case = F.when(mine, matches_of(members)) if case is None else case.when(mine, matches_of(members))
        matches = F.coalesce(case, F.lit(""))
    if keep_malformed:
        matches = F.when(F.col("_reason").isNull(), matches).otherwise(F.lit(""))
    else:
        events = events.filter(F.col("_reason").isNull())
    exploded = events.select("*", F.explode(F.split(matches, ",")).alias("_m"))
    keep = F.col("_m") != F.lit("")
    if keep_malformed:
        keep = keep | F.col("_reason").isNotNull()
    exploded = exploded.filter(keep)
    skipped = F.col("_m").startswith("s")
    i = F.when(F.col("_m") != F.lit(""), F.when(skipped, F.substring("_m", 2, 12)).otherwise(F.col("_m"))).cast("int")
    picked = exploded.select("*", i.alias("_i"), skipped.alias("_skipped"))
    i = F.col("_i")

    def unread_path(r: RuleRow) -> Column | None:
        whens = [F.when(u, F.lit(c.path)) for c in r.conditions if (u := unreadable(c)) is not None]
        return F.coalesce(*whens) if whens else None

    def time_of(r: RuleRow) -> Column:
        return F.col("proc_ms") if r.ts_path is None else fields.time(r.ts_path)

    ts = _by_rule(i, rows, time_of)
    event_time = _pick(i, [r.event_time for r in rows], "boolean")
    too_far = event_time & ts.isNotNull() & F.col("proc_ms").isNotNull() & (ts > F.col("proc_ms") + F.lit(max_ahead_ms))
    skip = F.when(F.col("_skipped"), F.concat(F.lit("value at "), _by_rule(i, rows, unread_path),
                                              F.lit(" is not a number")))
    key = _by_rule(i, rows, lambda r: F.lit("") if r.key_path is None else fields.value(r.key_path).json)
    return picked.select(
        _pick(i, [r.rule_id for r in rows], "string").alias("rule_id"),
        _pick(i, [r.rule_version for r in rows], "string").alias("rule_version"),
        _pick(i, [r.rule_type for r in rows], "string").alias("rule_type"),
        _pick(i, [r.rule_name for r in rows], "string").alias("rule_name"),
        _pick(i, [r.role for r in rows], "string").alias("role"),
        _pick(i, [r.rule_ref for r in rows], "string").alias("rule_ref"),
        event_time.alias("event_time"),
        _pick(i, [r.val_need for r in rows], "string").alias("val_need"),
        _pick(i, [r.key_path for r in rows], "string").alias("key_path"),
        _pick(i, [r.val_path for r in rows], "string").alias("val_path"),
        "topic", "seq", "raw", "proc_ms", "_reason",
        skip.alias("_skip"),
        key.cast("string").alias("k"),
        F.when(too_far, F.lit(None)).otherwise(ts).cast("long").alias("ts_ms"),
        F.when(too_far, F.lit(f"event time more than {max_ahead_ms} ms ahead of the record's broker timestamp"))
        .alias("ts_issue"),
        _by_rule(i, rows, lambda r: fields.value(r.val_path).num if r.val_path else None).cast("double").alias("num"),
        _by_rule(i, rows, lambda r: fields.value(r.val_path).json if r.val_path else None).cast("string").alias("jv"),
    )
