"""The keyed rules in force, compiled into the live plan: per event, one row per key
group it enters.

Rules used to reach the query as data (a broadcast join of every event with every rule
of its topic, each condition interpreted from the rule's row). That cost 55-67 us of
JVM time per event (tests/benchmarks/bench_live_plan.py): a generic comparison per
(event, rule) row, and a plan of 100k+ characters that Spark optimizes again at every
micro-batch (about 1 s per branch against a 500 ms trigger).

Here each keyed rule's conditions are literal expressions built by the engine's own
`compare_spec` (the backtest's), so Spark generates plain code for them. The price is
that a rule change means a new plan: the job restarts its query in-process on the same
checkpoint (same query id, state kept) when the registry's snapshot changes (job.py
`run`). Threshold rules are judged by the rule-set evaluator instead
(engine/rule_set.py, docs/decisions/0011-rule-set-evaluator.md), which the keyed rules
move to next.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F

from spark_jobs.engine.conditions import compare_spec
from spark_jobs.engine.values import Fields, FieldValue, extract_paths
from spark_jobs.rules.model import parse_rule
from spark_jobs.streaming.keyed_rows import PASS_GID, Slot
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


def _needs(rows: Sequence[RuleRow]) -> dict[str, set[str]]:
    """The forms (values.extract_paths) of each path the rules read."""
    needs: dict[str, set[str]] = {}
    for r in rows:
        for c in r.conditions:
            needs.setdefault(c.path, set()).add({"num": "num", "bool": "json"}.get(c.kind, "str"))
        if r.key_path:
            needs.setdefault(r.key_path, set()).add("json")
        if r.val_path:
            needs.setdefault(r.val_path, set()).update(("num", "json"))
    return needs


class _Checks:
    """A rule row's conditions as expressions over the extracted fields."""

    def __init__(self, fields: Fields) -> None:
        self.fields = fields

    def fv(self, p: str) -> FieldValue:
        return self.fields.value(p)

    def unreadable(self, c: Cond) -> Column | None:
        """The value of `c`'s path is there but is no number, and `c` orders numbers."""
        if c.kind != "num" or c.op not in _ORDERING:
            return None
        x = self.fields.value(c.path)
        return x.present & x.num.isNull()

    def ok(self, c: Cond) -> Column:
        return compare_spec(self.fv(c.path), c.op, c.kind, c.num, c.str, c.flag)

    def blocked(self, r: RuleRow) -> Column:
        """Only an unreadable value kept the event from passing `r`."""
        # Only when every other condition passes: an event that fails the rule anyway
        # was not kept from firing by the unreadable value.
        oks = [self.ok(c) for c in r.conditions]
        return ~_and(oks) & _and([o | u if (u := self.unreadable(c)) is not None else o
                                  for o, c in zip(oks, r.conditions, strict=True)])

    def unread_path(self, r: RuleRow) -> Column | None:
        """The first path of `r` whose value is unreadable (None: `r` orders no number)."""
        whens = [F.when(u, F.lit(c.path)) for c in r.conditions if (u := self.unreadable(c)) is not None]
        return F.coalesce(*whens) if whens else None


# ------------------------------------------------------------------ the keyed operator's input

# Separates the skip entries (`rule_id<SKIP_SEP>reason`) of one event in `_skips`.
SKIPS_SEP = "\u001e"
SKIP_SEP = "\u001f"


def key_group(r: RuleRow) -> str:
    """The key group of a keyed rule row: its key expression (the JSON path of its
    grouping/correlation key, "" for none: one global key).

    Not the source topic or role too: a correlation rule's primaries and its context
    come from two topics and must meet in one state (the rule's sub-state per key),
    and an event is of one topic, so grouping by topic would give it no fewer rows.
    The id is the path text, which a rule change keeps: state survives a new plan.
    """
    return r.key_path or ""


def key_rows(events: DataFrame, rows: Sequence[RuleRow], max_ahead_ms: int = 5_000,
             skipped_metric: str | Observation = "skipped_keyed",
             passing: Sequence[tuple[Column, Column]] = (),
             unreadable: Column | None = None) -> tuple[DataFrame, list[Slot]]:
    """The stateful operator's input: one row per (event, key group with a rule the
    event enters), and the slots (per rule row, by its index) that say how to read it.

    A row: `gid` (key group), `k` (the key's JSON text), `m` (indexes "0,3,7" of the
    group's rule rows the event enters: conditions passed, key, value and, for a
    processing-time rule, time present), the event once (`topic`, `seq`, `raw`,
    `proc_ms`) and one column per distinct value read by the group's rules: `t<i>`
    epoch ms of a timestamp path, `a<i>` why that time is unusable (more than
    `max_ahead_ms` ahead of the broker time: NULL otherwise), `n<i>`/`j<i>` number and
    JSON text of a value path (`j` only where some rule reads the text). Columns of
    another group's paths are NULL. `wm` is the newest event time of the row's
    event-time rules (for the job watermark). Before the rows are made, each (event,
    rule row) that a value the rule cannot read kept out is observed as
    `skipped_metric` (`rows`: `rule_id<SKIP_SEP>reason` per (event, rule row), as
    job.StatusReporter adds them up).

    Why: with one row per (event, rule), the operator's per-row cost (pyspark's input
    path, regrouping, the event's text on every row) held the job down; the rules on
    one key are evaluated together instead (jvm_operator.py). Records that are not events
    (`_reason` set) enter no key group (job.py `event_rows` carries them as dead letters).

    `unreadable`: array<string> per event, more `rule_id<SKIP_SEP>reason` entries to
    observe with the keyed rules' (the threshold rules', judged by the rule-set
    evaluator: rule_set.thresholds).

    `passing`: (condition, struct) pairs, each a row to carry through the operator
    unchanged where its condition holds (gid PASS_GID, the struct in `_pass`, NULL on
    the key rows); the structs are of one type and may read `_tm`. With `passing`,
    every input row is kept (a row whose `_reason` is set enters no key group but may
    be carried: a dead letter). The live plan is one line from its one scan of the
    input to the sink (job.py `build`, `_chain`): Spark plans a DataFrame that feeds
    two branches of a streaming query once per branch (the input scanned and parsed
    again, a stateful operator twice with two states), so whatever does not enter an
    operator's keys goes through it so.
    """
    if not passing:
        events = events.filter(F.col("_reason").isNull())
    ts_paths = sorted({r.ts_path for r in rows if r.ts_path})
    val_paths = sorted({r.val_path for r in rows if r.val_path})
    events, fields = extract_paths(events, _needs(rows), set(ts_paths), to_json_path=str)
    checks = _Checks(fields)
    tcol = {p: f"t{i}" for i, p in enumerate(ts_paths)}
    acol = {p: f"a{i}" for i, p in enumerate(ts_paths)}
    ncol = {p: f"n{i}" for i, p in enumerate(val_paths)}
    # The JSON text goes to the operator only where a rule keeps or compares it (distinct
    # counts, a correlation's `last` context); elsewhere the check below is enough.
    jcol = {p: f"j{i}" for i, p in enumerate(val_paths)
            if any(r.val_path == p and (r.val_need == "json" or r.rule_type == "correlation") for r in rows)}
    far = f"event time more than {max_ahead_ms} ms ahead of the record's broker timestamp"

    def far_of(r: RuleRow) -> str | None:
        return acol[r.ts_path] if r.ts_path and r.event_time else None

    slots = [Slot(r.rule_ref, r.role, r.event_time, tcol[r.ts_path] if r.ts_path else "proc_ms", far_of(r),
                  ncol.get(r.val_path or ""), jcol.get(r.val_path or "")) for r in rows]

    # Step 1: each time and value once per event.
    values: list[Column] = []
    for p in ts_paths:
        t = fields.time(p)
        values.append(t.cast("long").alias(tcol[p]))
        too_far = t.isNotNull() & F.col("proc_ms").isNotNull() & (t > F.col("proc_ms") + F.lit(max_ahead_ms))
        values.append(F.when(too_far, F.lit(far)).alias(acol[p]))
    for p in val_paths:
        values.append(fields.value(p).num.cast("double").alias(ncol[p]))
        if p in jcol:
            values.append(fields.value(p).json.cast("string").alias(jcol[p]))
    events = events.select("*", *values)

    def ts_of(n: int) -> Column:
        """The time rule row n uses: NULL when it is unusable."""
        s = slots[n]
        t = F.col(s.ts_col)
        return F.when(F.col(s.far_col).isNull(), t) if s.far_col else t

    def source(r: RuleRow) -> Column:
        mine = F.col("in_topic") == F.lit(r.topic)
        return mine & (F.col("route_from") == F.lit(r.route_from)) if r.route_from is not None else mine

    # Each distinct source test and condition once per event, as a column of its own
    # step: the rules of a set often share them (every velocity rule of the bench tests
    # `type != "view"`), and inside the rules' ANDs Spark would evaluate each copy.
    shared: dict[str, tuple[str, Column]] = {}

    def once(e: Column) -> Column:
        name, _ = shared.setdefault(str(e), (f"_c{len(shared)}", e))
        return F.col(name)

    def passes(r: RuleRow) -> Column:
        return _and([once(source(r)), *[once(checks.ok(c)) for c in r.conditions]])

    def enters(n: int, r: RuleRow) -> Column:
        """What keyed_rows' filter asked of an (event, rule) row, but its key."""
        value = F.lit(True)
        if r.val_need == "num" and r.val_path:
            value = F.col(ncol[r.val_path]).isNotNull()
        elif r.val_need == "json" and r.val_path:
            value = fields.value(r.val_path).json.isNotNull()
        timed = ts_of(n).isNotNull() if not r.event_time else F.lit(True)
        return passes(r) & value & timed

    def not_number(p: str) -> Column:
        x = fields.value(p)
        return x.json.isNotNull() & x.num.isNull()

    # Step 2: per rule row whether the event enters it, and what kept it out if a value
    # it cannot read did (counted per rule and reason, as the status reports them; each
    # part NULL when empty, so the joined entries hold no empty one).
    flags = [enters(n, r).alias(f"_e{n}") for n, r in enumerate(rows)]
    entries: list[Column] = []
    unread = {c.path: u for r in rows for c in r.conditions if (u := checks.unreadable(c)) is not None}
    blockable = [r for r in rows if any(checks.unreadable(c) is not None for c in r.conditions)]
    if blockable:
        # Looked for once per event; the rules' blocked tests run only for an event that has one.
        entries.append(F.when(_or(list(unread.values())), F.nullif(F.concat_ws(SKIPS_SEP, *[
            F.when(source(r) & checks.blocked(r), F.concat(F.lit(f"{r.rule_id}{SKIP_SEP}value at "),
                                                            checks.unread_path(r), F.lit(" is not a number")))
            for r in blockable]), F.lit(""))))
    numeric = [(n, r) for n, r in enumerate(rows) if r.val_need == "num" and r.val_path]
    if numeric:
        entries.append(F.when(_or([not_number(p) for p in {r.val_path for _, r in numeric if r.val_path}]),
                              F.nullif(F.concat_ws(SKIPS_SEP, *[
            F.when(passes(r) & not_number(r.val_path),
                   F.lit(f"{r.rule_id}{SKIP_SEP}value at {r.val_path} is not a number"))
            for _, r in numeric if r.val_path]), F.lit(""))))
    if unreadable is not None:
        entries.append(F.nullif(F.array_join(unreadable, SKIPS_SEP), F.lit("")))
    events = events.select("*", *[e.alias(name) for name, e in shared.values()])
    events = events.select("*", *flags, F.concat_ws(SKIPS_SEP, *entries).alias("_skips"))
    pass_type = events.select(passing[0][1]).schema[0].dataType if passing else None

    # Step 3: per key group of the event's source, one struct; exploded into rows.
    value_cols = [(c, "long") for c in tcol.values()] + [(c, "string") for c in acol.values()] + \
        [(c, "double") for c in ncol.values()] + [(c, "string") for c in jcol.values()]
    sources: dict[tuple[str, str | None], dict[str, list[int]]] = {}
    for n, r in enumerate(rows):
        sources.setdefault((r.topic, r.route_from), {}).setdefault(key_group(r), []).append(n)

    def group_struct(gid: str, members: list[int], carry: Column | None = None) -> Column:
        used = {c for n in members for c in (slots[n].ts_col, slots[n].far_col, slots[n].num_col, slots[n].jv_col) if c}
        times = [F.when(F.col(f"_e{n}"), ts_of(n)) for n in members if slots[n].event_time]
        wm = F.lit(None).cast("long") if not times else times[0] if len(times) == 1 else F.greatest(*times)
        key_path = rows[members[0]].key_path if members else None
        return F.struct(
            F.lit(gid).alias("gid"),
            (F.lit("") if key_path is None else fields.value(key_path).json).cast("string").alias("k"),
            F.concat_ws(",", *[F.when(F.col(f"_e{n}"), F.lit(str(n))) for n in members]).alias("m"),
            wm.cast("long").alias("wm"),
            *[(F.col(c) if c in used else F.lit(None)).cast(t).alias(c) for c, t in value_cols],
            *([] if pass_type is None else [(F.lit(None).cast(pass_type) if carry is None else carry).alias("_pass")]),
        )

    # The carried rows of an input row: NULL entries where their condition fails
    # (filtered out below with the key groups the event does not enter).
    carries = [F.when(cond, group_struct(PASS_GID, [], struct)) for cond, struct in passing]
    event = F.col("_reason").isNull()
    groups: Column | None = None
    for by_group in sources.values():
        r0 = rows[next(iter(by_group.values()))[0]]  # any row of the source: its source test
        arr = F.array(*[group_struct(g, members) for g, members in by_group.items()], *carries)
        test = source(r0) & event if passing else source(r0)
        groups = F.when(test, arr) if groups is None else groups.when(test, arr)
    if groups is None:  # no keyed rules: one struct per event with no rule, filtered out below
        groups = F.array(group_struct("", []), *carries)
    elif carries:
        groups = groups.otherwise(F.array(*carries))
    # Observed per micro-batch, per event (the rows below are per key group).
    skipped = F.flatten(F.collect_list(F.when(F.col("_skips") != F.lit(""), F.split(F.col("_skips"), SKIPS_SEP))))
    events = events.observe(skipped_metric, skipped.alias("rows"))
    exploded = events.select("topic", "seq", "raw", "proc_ms", F.explode(groups).alias("_g"))
    entered = (F.col("_g.m") != F.lit("")) & F.col("_g.k").isNotNull()
    if passing:
        entered = entered | (F.col("_g.gid") == F.lit(PASS_GID))
    out = exploded.filter(entered).select(
        "_g.gid", "_g.k", "_g.m", "topic", "seq", "raw", "proc_ms", "_g.wm", *[f"_g.{c}" for c, _ in value_cols],
        *(["_g._pass"] if passing else []))
    return out, slots
