"""Velocity rules in batch: sliding (per-event, not aligned) windows, evaluated in the JVM.

Rules that read the same topic with the same key and clock form one group, evaluated in
one pass: one shuffle and one sort of the events by (key, time, arrival); the event
text rides along once, so emitted rows need no join back to their events. Ten rules
grouped by user cost one sort, not ten.

Two ways to run the pass, with the same detections but for sums past DECIMAL(38,12)
(tests/integration/test_backtest_properties.py runs both against the reference):

- the JVM pass (`jvm_pass`, the default in a classic session): the live job's own
  window code (spark_jobs/jvm/processor, BatchVelocity over Velocity.Window) slides a
  window per key and rule over the sorted rows, O(1) amortized per entered event, with
  the live job's exact sums and its dead letters where a sum overflows;
- Spark window functions (`_fired_by_windows`; Spark Connect, which has no Py4J
  gateway to call the JVM pass): each rule's window an aggregate over its own
  qualifying rows (`CASE WHEN qualifies THEN value END`); rules with the same
  conditions and value share those columns and the window aggregates that do not
  depend on the window's size (`_Shared`). Sums in DECIMAL(38,12)
  (docs/rule-language.md, Limits). In the benchmark's ten-rule group this was 27
  window expressions in three Window operators, which is why the JVM pass is the
  default where it can run.

In both, the window at an event at time t holds the key's qualifying events with
timestamps in (t - W, t] that were taken at or before it; equal timestamps are taken
in arrival order. As window functions: a range frame on the timestamp alone would also
include later events with the same timestamp. So count, sum and avg are the difference
of two prefix frames (all up to this event in (time, arrival) order, less all at or
before t - W); min, max and distinct_count, which do not subtract, combine two frames:

  A: strictly earlier timestamps inside the window  (range frame [-(W-1), -1] in ms)
  B: the same timestamp, arrival order up to this event  (from the prefix frame)

min/max take the extreme of both; distinct_count collects [t - W + 1, t] and leaves out
the rows of time t that arrived after the event.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import reduce

from py4j.java_gateway import JavaClass
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.window import WindowSpec

from spark_jobs.engine.conditions import all_conditions
from spark_jobs.engine.emits import (
    explode_matching,
    extra,
    json_member,
    json_number,
    json_string,
    matching,
    rule_table,
)
from spark_jobs.engine.values import Fields
from spark_jobs.rules.model import VelocityRule
from spark_jobs.spark import jvm_class

ROUTED_COLUMNS = ["topic", "seq", "raw", "v", "proc_ms", "ts_ms"]


@dataclass
class VelocityOutput:
    # EMIT_COLUMNS of the rules that emit to the sink, and `reason`: where set, no
    # detection but a dead letter (pipeline.EngineResult.evaluated)
    emits: DataFrame | None
    routed: dict[str, DataFrame]  # rule id -> ROUTED_COLUMNS, rules with emit_to_sink false
    dead: list[DataFrame]


def _group_key(rule: VelocityRule) -> tuple[str, str | None, str | None]:
    return rule.source_topic, rule.group_by, rule.timestamp_field if rule.uses_event_time else None


def _value_key(rule: VelocityRule) -> tuple[str, str | None]:
    """Rules with equal keys aggregate the same value (see `_value`)."""
    kind = {"count": "count", "distinct_count": "json"}.get(rule.aggregation_type, "num")
    return kind, rule.aggregation_field


def _value(rule: VelocityRule, fields: Fields) -> Column:
    """What the rule aggregates; NULL when the event lacks it (the event then does not
    enter the window). count needs no value, but a named aggregation_field must exist."""
    kind, path = _value_key(rule)
    if kind == "count":
        return F.when(fields.value(path).present, F.lit("")) if path else F.lit("")
    if kind == "json":
        return fields.value(path).json
    return fields.value(path).num


def _time(rule: VelocityRule, fields: Fields) -> Column:
    return fields.time(rule.timestamp_field) if rule.uses_event_time else F.col("proc_ms")


@dataclass(frozen=True)
class _Input:
    """A rule's columns in its group: `q` (the event enters its window), `x` (the value
    it aggregates). Rules with the same conditions and value share them."""

    q: str
    x: str


def _entered(
    events: DataFrame, rules: list[VelocityRule], fields: Fields, timed: bool = True
) -> tuple[DataFrame, list[_Input]]:
    """The group's events that enter at least one rule's window: k, ts_ms, and the
    rules' `_Input` columns: an `x` per distinct value, a `q` per distinct (value,
    conditions), not one of each per rule, for the rows carry them through every window
    operator. `timed`: only those with a usable timestamp (the others are `_dead`)."""
    first = rules[0]
    v = F.col("v")
    topic_events = events.filter(F.col("topic") == first.source_topic)
    values: dict[tuple, tuple[str, Column]] = {}
    entries: dict[tuple, str] = {}
    cols: list[Column] = []
    inputs: list[_Input] = []
    for r in rules:
        vkey = _value_key(r)
        if vkey not in values:
            name, value = f"_x{len(values)}", _value(r, fields)
            values[vkey] = (name, value)
            cols.append(value.alias(name))
        x, value = values[vkey]
        qkey = (vkey, tuple(json.dumps(c.model_dump(mode="json"), sort_keys=True) for c in r.conditions))
        if qkey not in entries:
            entries[qkey] = f"_q{len(entries)}"
            cols.append((all_conditions(v, r.conditions, fields.values) & value.isNotNull()).alias(entries[qkey]))
        inputs.append(_Input(entries[qkey], x))
    base = topic_events.select(
        "topic", "seq", "raw", "proc_ms", fields.key(first.group_by).alias("k"), _time(first, fields).alias("ts_ms"),
        *cols,
    )
    q = [F.col(name) for name in entries.values()]
    base = base.filter(F.col("k").isNotNull() & reduce(lambda a, b: a | b, q))
    return (base.filter(F.col("ts_ms").isNotNull()) if timed else base), inputs


def _dead(events: DataFrame, rules: list[VelocityRule], fields: Fields) -> DataFrame:
    """Events that enter a rule of the group but have no usable timestamp: relevant, but
    they cannot be placed in time. The timestamp test runs first, so the rules'
    conditions are evaluated only for the (normally few) events without one."""
    first = rules[0]
    untimed = events.filter((F.col("topic") == first.source_topic) & _time(first, fields).isNull())
    entered, inputs = _entered(untimed, rules, fields, timed=False)
    ids = F.array(*[F.lit(r.rule_id) for r in rules])
    what = f"timestamp field {first.timestamp_field!r}" if first.uses_event_time else "processing time"
    return explode_matching(entered, matching([F.col(i.q) for i in inputs]), ["topic", "seq", "raw"]).select(
        "topic", "seq", "raw", F.lit(f"missing or unparseable {what} needed by velocity rule").alias("reason"),
        F.element_at(ids, F.col("_i") + 1).alias("rule_id"),
    )


@dataclass
class _Shared:
    """Window columns of one group, each computed once however many rules need it.

    Spark computes every window expression written, equal ones too (one plan had
    `sum(x) OVER w` three times in its Window operator); rules of a group often need
    the same one: the running count or sum of the events entering under the same
    conditions, whatever each rule's window. `get` names a column by what it computes;
    `add` puts them all in one projection, so one window operator per frame order."""

    stem: str  # of the columns' names
    columns: dict[str, Column] = field(default_factory=dict)
    names: dict[tuple, str] = field(default_factory=dict)

    def get(self, key: tuple, build: Callable[[], Column]) -> Column:
        name = self.names.get(key)
        if name is None:
            name = self.names[key] = f"{self.stem}{len(self.names)}"
            self.columns[name] = build()
        return F.col(name)

    def add(self, df: DataFrame) -> DataFrame:
        return df.select("*", *[c.alias(n) for n, c in self.columns.items()]) if self.columns else df


class _Frames:
    """The group's window specs (each one is Py4J calls to build: once per group)."""

    def __init__(self) -> None:
        self.by_time: WindowSpec = Window.partitionBy("k").orderBy("ts_ms")
        # Everything up to this event in (time, arrival) order; and strictly before it.
        in_order = Window.partitionBy("k").orderBy("ts_ms", "seq")
        self.prefix: WindowSpec = in_order.rowsBetween(Window.unboundedPreceding, 0)
        self.before: WindowSpec = in_order.rowsBetween(Window.unboundedPreceding, -1)


def _aggregate(rule: VelocityRule, inp: _Input, frames: _Frames, shared: _Shared) -> Column:
    """The rule's aggregation over its window at each event (meaningful where its `q`),
    from the group's shared window columns."""
    w_ms = rule.window_ms
    q, x = inp.q, inp.x
    val = F.when(F.col(q), F.col(x))
    kind = rule.aggregation_type

    def in_window(name: str, agg: Callable[[], Column]) -> Column:
        """agg over the window: everything up to this event in (time, arrival) order,
        less everything at or before t - W. The first is the same for every rule with
        these inputs; the second is the rule's own.

        Spark re-aggregates a sliding frame from scratch whenever it moves (O(n * w)),
        which is quadratic for a busy key; both frames here are prefix frames, which
        Spark computes incrementally: O(n). Sums use DECIMAL so the difference is exact.
        """
        upto_me = shared.get((name, q, x, "upto"), lambda: agg().over(frames.prefix))
        upto_low = shared.get((name, q, x, w_ms),
                              lambda: agg().over(frames.by_time.rangeBetween(Window.unboundedPreceding, -w_ms)))
        return F.coalesce(upto_me, F.lit(0)) - F.coalesce(upto_low, F.lit(0))

    def count() -> Column:
        # `q` implies a value (`_entered`), so this counts the values too: avg shares it.
        return in_window("count", lambda: F.count(F.when(F.col(q), F.lit(1)))).cast("double")

    def total() -> Column:
        return in_window("sum", lambda: F.sum(val.try_cast("decimal(38,12)"))).cast("double")

    if kind == "count":
        return count()
    if kind == "sum":
        return total()
    if kind == "avg":
        # A row that does not enter this rule may see an empty window: NULL, not an error.
        # The exact sum rounded once to a double, then divided in double: what the live
        # job computes (math.fsum / n). DECIMAL division would round to its own scale.
        return F.try_divide(total(), count())
    # min, max and distinct_count do not subtract. A: a sliding range frame over the
    # strictly earlier timestamps inside the window. B (this timestamp, arrival order up
    # to this event) from the prefix frame the sums use: the greatest (ts_ms, value) of
    # the prefix has this event's timestamp (the rows come in time order), and among
    # equal timestamps the extreme value. A frame per (key, timestamp) would do the
    # same as a third window operator, over partitions of mostly one row.

    def over_a(name: str, a: Callable[[], Column]) -> Column:
        if w_ms <= 1:
            return F.lit(None).cast("double")
        return shared.get((name, q, x, w_ms), lambda: a().over(frames.by_time.rangeBetween(-(w_ms - 1), -1)))

    if kind == "max":
        # NULL sorts first in a struct: a value wins over none.
        same_ts = shared.get(("max", q, x, "upto"), lambda: F.max(F.struct(F.col("ts_ms").alias("t"), val.alias("x")))
                             .over(frames.prefix))["x"]
        return F.greatest(over_a("max", lambda: F.max(val)), same_ts)
    if kind == "min":
        # The earliest (-ts_ms), then a value before none, then the smallest value.
        first = F.struct((-F.col("ts_ms")).alias("t"), val.isNull().alias("n"), val.alias("x"))
        same_ts = shared.get(("min", q, x, "upto"), lambda: F.min(first).over(frames.prefix))["x"]
        return F.least(over_a("min", lambda: F.min(val)), same_ts)
    if kind == "distinct_count":
        # A and B in one range frame [t - W + 1, t]: its rows of this timestamp that
        # arrived after this event are filtered out before counting.
        taken = F.collect_list(F.when(F.col(q), F.struct(F.col("ts_ms").alias("t"), F.col("seq").alias("s"),
                                                         val.alias("x"))))
        frame = shared.get(("distinct", q, x, w_ms), lambda: taken.over(frames.by_time.rangeBetween(-(w_ms - 1), 0)))
        mine = F.filter(frame, lambda e: (e["t"] < F.col("ts_ms")) | (e["s"] <= F.col("seq")))
        return F.size(F.array_distinct(F.transform(mine, lambda e: e["x"]))).cast("double")
    raise ValueError(kind)  # pragma: no cover - the model rejects other values


def _fires(i: int, rule: VelocityRule, inp: _Input, frames: _Frames, shared: _Shared) -> Column:
    """Whether rule i emits at this event, per its emit_mode. `last_event` compares with
    the aggregation at the key's previous event that entered this rule, while that event
    is in this one's window: once the window has emptied, the key starts a new episode
    (the live job has dropped the key's state by then; README, "last_event"). That
    event's time is the same for every rule with these inputs."""
    agg, q = F.col(f"_a{i}"), F.col(inp.q)
    above = q & (agg >= F.lit(float(rule.threshold)))
    if rule.emit_mode == "all_events":
        return above
    prev = shared.get(("agg", i), lambda: F.last(F.when(q, agg), ignorenulls=True).over(frames.before))
    prev_ts = shared.get(("ts", inp.q), lambda: F.last(F.when(q, F.col("ts_ms")), ignorenulls=True).over(frames.before))
    new_episode = prev.isNull() | (prev_ts <= F.col("ts_ms") - F.lit(rule.window_ms))
    return above & (new_episode | (prev < F.lit(float(rule.threshold))))


# The JVM pass over a group's events (spark_jobs/jvm/processor); `jvm_pass` says when.
BATCH_CLASS = "ruleplatform.keyed.BatchVelocity"
JVM_PASS_CONF = "spark.rules.backtest.velocityPass"


def jvm_pass(spark: SparkSession) -> JavaClass | None:
    """`BatchVelocity`, when the session can run it: classic (Spark Connect has no Py4J
    gateway), the platform's jars loaded, and `spark.rules.backtest.velocityPass` not
    `windows`. Otherwise the groups are planned as Spark window functions, with the
    same results but for sums: the JVM's are exact (the live job's), the windows' sum
    values rounded to 12 decimal places."""
    if spark.conf.get(JVM_PASS_CONF, "jvm") == "windows":
        return None
    return jvm_class(spark, BATCH_CLASS)


def _fired_in_jvm(entry: JavaClass, entered: DataFrame, rules: list[VelocityRule], inputs: list[_Input]) -> DataFrame:
    """`_fired` by BatchVelocity: one sort by (k, time, arrival), then one pass with a
    sliding window per key and rule, in place of `_fired_by_windows`' window functions."""
    spec = {"rules": [
        {"q": inp.q, "x": inp.x, "aggregation_type": r.aggregation_type, "window_ms": r.window_ms,
         "threshold": float(r.threshold), "all_events": r.emit_mode == "all_events"}
        for r, inp in zip(rules, inputs, strict=True)
    ]}
    columns = ["topic", "seq", "raw", "proc_ms", "k", "ts_ms", *dict.fromkeys(c for i in inputs for c in (i.q, i.x))]
    return DataFrame(entry.fired(entered.select(*columns)._jdf, json.dumps(spec, allow_nan=False)),
                     entered.sparkSession)


def _fired(events: DataFrame, rules: list[VelocityRule], fields: Fields) -> DataFrame:
    """Fired rows of one group: the event columns plus `_i` (index of the rule that
    fired), `agg`, and `reason`: where set, the rule could not be evaluated at the event
    (a dead letter; the JVM pass only, as the live job: an exact sum beyond the double
    range)."""
    entered, inputs = _entered(events, rules, fields)
    entry = jvm_pass(entered.sparkSession)
    if entry is not None:
        return _fired_in_jvm(entry, entered, rules, inputs)
    return _fired_by_windows(entered, rules, inputs).withColumn("reason", F.lit(None).cast("string"))


def _fired_by_windows(entered: DataFrame, rules: list[VelocityRule], inputs: list[_Input]) -> DataFrame:
    """`_fired` as Spark window functions (Spark Connect, or the JVM pass turned off)."""
    # One shuffle and one sort serve every window below: each Window's required
    # distribution (by k) and ordering (k, ts_ms[, seq]) is already met.
    ordered = entered.repartition("k").sortWithinPartitions("k", "ts_ms", "seq")
    frames = _Frames()
    windows = _Shared("_w")
    aggs = [_aggregate(r, inp, frames, windows).alias(f"_a{i}") for i, (r, inp) in enumerate(zip(rules, inputs, strict=True))]
    keep = ["topic", "seq", "raw", "proc_ms", "ts_ms"]
    q_names = list(dict.fromkeys(inp.q for inp in inputs))
    with_aggs = windows.add(ordered).select(*keep, "k", *q_names, *aggs)
    previous = _Shared("_p")
    fired = matching([_fires(i, r, inp, frames, previous) for i, (r, inp) in enumerate(zip(rules, inputs, strict=True))])
    agg_array = F.array(*[F.col(f"_a{i}") for i in range(len(rules))])
    # Window functions may not sit under a generator: the matches first, then explode.
    fired_rows = previous.add(with_aggs).select(*keep, fired.alias("_fired"), agg_array.alias("_aggs"))
    out = explode_matching(fired_rows, F.col("_fired"), [*keep, "_aggs"])
    return out.select(*keep, "_i", F.element_at("_aggs", F.col("_i") + 1).alias("agg"))


def velocity_rules(events: DataFrame, rules: list[VelocityRule], fields: Fields) -> VelocityOutput:
    groups: dict[tuple, list[VelocityRule]] = defaultdict(list)
    for r in rules:
        groups[_group_key(r)].append(r)
    out = VelocityOutput(emits=None, routed={}, dead=[])
    emits: list[DataFrame] = []
    for _, rs in sorted(groups.items(), key=lambda kv: tuple(str(x) for x in kv[0])):
        fired = _fired(events, rs, fields)
        out.dead.append(_dead(events, rs, fields))
        for i, r in enumerate(rs):
            if not r.emit_to_sink:
                out.routed[r.rule_id] = fired.filter((F.col("_i") == i) & F.col("reason").isNull()).select(
                    "topic", "seq", "raw", F.parse_json("raw").alias("v"), "proc_ms", "ts_ms"
                )
        sink = [i for i, r in enumerate(rs) if r.emit_to_sink]
        if not sink:
            continue
        meta = rule_table(rs, agg_type=[r.aggregation_type for r in rs])
        m = F.element_at(meta, F.col("_i") + 1)
        emitted = fired.filter(F.col("_i").isin(sink)) if len(sink) < len(rs) else fired
        emits.append(emitted.select(
            *[m[c].alias(c) for c in ("rule_id", "rule_version", "rule_type", "rule_name")],
            "topic", "seq", "ts_ms", "raw",
            velocity_members(m["agg_type"], F.col("agg")).alias("extra"),
            m["head"].alias("head"),
            "reason",
        ))
    out.emits = reduce(lambda a, b: a.unionByName(b), emits) if emits else None
    return out


def velocity_members(agg_type: Column, agg: Column) -> Column:
    """The velocity members of a detection; shared with the live job."""
    value = F.when(agg_type.isin("count", "distinct_count"), json_number(agg.cast("long"))).otherwise(json_number(agg))
    return extra(
        json_member("aggregation_type", json_string(agg_type)),
        json_member("aggregation_value", value),
    )
