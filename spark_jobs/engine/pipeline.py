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
from spark_jobs.engine.threshold import threshold_emits
from spark_jobs.engine.values import Fields, extract_fields
from spark_jobs.engine.velocity import velocity_rules
from spark_jobs.rules.model import AnyRule, CorrelationRule, VelocityRule


@dataclass
class EngineResult:
    detections: DataFrame | None  # DETECTION_COLUMNS
    dead_letters: list[DataFrame] = field(default_factory=list)
    routed: dict[str, DataFrame] = field(default_factory=dict)  # velocity rule id -> routed events
    primaries: dict[str, DataFrame] = field(default_factory=dict)  # correlation rule id -> primaries
    # DETECTION_COLUMNS, `raw` and `reason`: the detections and, where `reason` is set,
    # the events a velocity rule could not evaluate (dead letters, as the live job's; not
    # in `detections`). One plan holds both, so a writer of both (the backtest) runs the
    # rules once: two filters of one plan would run it twice.
    evaluated: DataFrame | None = None


def _union(dfs: list[DataFrame]) -> DataFrame | None:
    if not dfs:
        return None
    return union_all(dfs)


def active_rules(rules: list[AnyRule]) -> list[AnyRule]:
    return [r for r in rules if r.enabled]


def evaluate(events: DataFrame, rules: list[AnyRule], fields: Fields | None = None) -> EngineResult:
    """Evaluate enabled rules over `events` (columns of events.parse_events, or without
    `v` but with the columns of `fields`, see values.extract_fields)."""
    rules = active_rules(rules)
    if fields is None:
        events, fields = extract_fields(events, rules)
    result = EngineResult(detections=None)
    emits: list[DataFrame] = []

    t = threshold_emits(events, rules)
    if t is not None:
        emits.append(t)

    vel = velocity_rules(events, [r for r in rules if isinstance(r, VelocityRule)], fields)
    result.dead_letters += vel.dead
    result.routed.update(vel.routed)
    if vel.emits is not None:
        emits.append(vel.emits)

    correlation = [r for r in rules if isinstance(r, CorrelationRule)]
    sources: dict[str, tuple[DataFrame, Fields]] = {}
    for rule in correlation:
        if rule.velocity_filter_rule_id is not None:
            routed = result.routed.get(rule.velocity_filter_rule_id)
            # A disabled or absent velocity rule routes nothing: no primaries at all.
            sources[rule.rule_id] = extract_fields(routed, [rule]) if routed is not None else (events.limit(0), fields)
    if correlation:
        out = correlation_rules(events, correlation, fields, sources)
        result.dead_letters.append(out.dead)
        result.primaries.update(out.primaries)
        emits.append(out.emits)

    none = F.lit(None).cast("string").alias("reason")
    all_emits = _union([e.select(*EMIT_COLUMNS, "head", "reason" if "reason" in e.columns else none) for e in emits])
    if all_emits is not None:
        result.evaluated = render(all_emits, keep=("raw", "reason"))
        result.detections = result.evaluated.filter(F.col("reason").isNull()).drop("raw", "reason")
    return result
