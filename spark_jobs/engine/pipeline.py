"""A rule set over parsed events: the batch evaluation shared by the backtest.

The order matters only for routing: velocity rules with `emit_to_sink: false` are
evaluated first so that correlation rules naming them (`velocity_filter_rule_id`)
receive exactly the events those rules emitted, which never reach the sink.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.engine.correlation import correlation_rules
from spark_jobs.engine.detections import render
from spark_jobs.engine.emits import EMIT_COLUMNS
from spark_jobs.engine.frames import union_all
from spark_jobs.engine.keyed import FIRST, SECOND, KeyedRows, entered, judge
from spark_jobs.engine.threshold import threshold_emits, with_threshold_matches
from spark_jobs.engine.velocity import velocity_rules
from spark_jobs.rules.model import AnyRule
from spark_jobs.streaming.registry import ROUTED_TOPIC


@dataclass
class EngineResult:
    detections: DataFrame | None  # DETECTION_COLUMNS
    dead_letters: list[DataFrame] = field(default_factory=list)
    routed: DataFrame | None = None  # velocity.ROUTED_COLUMNS: what rules with emit_to_sink false emitted
    primaries: DataFrame | None = None  # rule_id: one row per correlation primary
    # DETECTION_COLUMNS, `raw` and `reason`: the detections and, where `reason` is set,
    # the events a velocity rule could not evaluate (dead letters, as the live job's; not
    # in `detections`). One plan holds both, so a writer of both (the backtest) runs the
    # rules once: two filters of one plan would run it twice.
    evaluated: DataFrame | None = None


def active_rules(rules: list[AnyRule]) -> list[AnyRule]:
    return [r for r in rules if r.enabled]


def judged(events: DataFrame, rules: list[AnyRule]) -> DataFrame:
    """`events` (`topic`, `v`, `proc_ms`) with what the evaluator makes of each for the
    enabled rules: the threshold matches and the keyed rows, in one projection, so a
    caller can keep these and drop `v` (the backtest)."""
    rules = active_rules(rules)
    events = with_threshold_matches(events, rules)
    keyed = KeyedRows.of(rules)
    return judge(events, keyed) if keyed.rules else events


def evaluate(events: DataFrame, rules: list[AnyRule]) -> EngineResult:
    """Evaluate enabled rules over `events` (columns of events.parse_events, or `judged`'s
    for the same rules)."""
    rules = active_rules(rules)
    result = EngineResult(detections=None)
    emits: list[DataFrame] = []

    t = threshold_emits(events, rules)
    if t is not None:
        emits.append(t)

    keyed = KeyedRows.of(rules)
    if keyed.rules:
        if FIRST not in events.columns:
            events = judge(events, keyed)
        meta = F.element_at(keyed.table(), F.col("_i") + 1)
        first = entered(events, FIRST)
        vel = velocity_rules(first, keyed, meta)
        result.routed = vel.routed
        if vel.emits is not None and vel.dead is not None:
            emits.append(vel.emits)
            result.dead_letters.append(vel.dead)
        if keyed.indexes("primary"):
            # The second operator's rules (fed by a velocity rule) take their context
            # from the events and their primaries from what the velocity rule routed.
            rows = [first, entered(events, SECOND)]
            if vel.routed is not None:
                routed = vel.routed.select(
                    "topic", "seq", "raw", F.parse_json("raw").alias("v"), "proc_ms",
                    F.lit(ROUTED_TOPIC).alias("in_topic"), F.col("rule_id").alias("route_from"))
                rows.append(entered(judge(routed, keyed), SECOND))
            out = correlation_rules(union_all(rows), keyed, meta)
            if out.emits is not None and out.dead is not None:
                result.dead_letters.append(out.dead)
                result.primaries = out.primaries
                emits.append(out.emits)

    none = F.lit(None).cast("string").alias("reason")
    if emits:
        all_emits = union_all([e.select(*EMIT_COLUMNS, "head", "reason" if "reason" in e.columns else none)
                               for e in emits])
        result.evaluated = render(all_emits, keep=("raw", "reason"))
        result.detections = result.evaluated.filter(F.col("reason").isNull()).drop("raw", "reason")
    return result
