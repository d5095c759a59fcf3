"""The rule set as data for the JVM evaluator (spark_jobs/jvm, `ruleplatform.rules`).

The rule model decides what each rule says (paths, operators, what a rule value is:
`conditions.value_spec`); this module writes that down as one JSON spec per rule-set
version, which the evaluator compiles once per executor JVM. The plan that calls it has
the same shape whatever the rules: one function call per event, the spec its argument.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from pyspark.sql import Column, SparkSession

from spark_jobs.engine.conditions import value_spec
from spark_jobs.rules.model import AnyRule, CorrelationRule, ThresholdRule, VelocityRule, parse_rule
from spark_jobs.spark import jvm_column
from spark_jobs.streaming.rules_source import Cond, RuleRow, rule_rows

_SEGMENT = re.compile(r"\['((?:[^'\\]|\\.)*)'\]")

EVALUATOR_CLASS = "ruleplatform.rules.Evaluate"


def segments(json_path: str | None) -> list[str] | None:
    """`$['user']['id']` (values.json_path) -> ["user", "id"]."""
    if json_path is None:
        return None
    return [re.sub(r"\\(.)", r"\1", m.group(1)) for m in _SEGMENT.finditer(json_path)]


def _cond_spec(c: Cond) -> dict[str, object]:
    return {"path": segments(c.path), "text": c.path, "op": c.op, "kind": c.kind, "num": c.num, "str": c.str,
            "bool": c.flag}


def threshold_rows(rules: Iterable[AnyRule]) -> list[RuleRow]:
    """The rule rows of `rules`' threshold rules, in their order."""
    return [row for r in rules if isinstance(r, ThresholdRule) for row in rule_rows(r, routed_topic="")]  # no routed role


def rule_set_spec(threshold: Sequence[RuleRow]) -> str:
    """The spec of the `threshold` rule rows, in the given order (a match names its rule
    row by its index here)."""
    spec = [{"id": r.rule_id, "version": r.rule_version, "name": r.rule_name, "topic": r.topic,
             "conditions": [_cond_spec(c) for c in r.conditions]}
            for r in threshold]
    return json.dumps({"threshold": spec}, sort_keys=True, separators=(",", ":"))


def signature(rule: AnyRule, epoch: int = 0) -> str:
    """What a window or context buffer depends on; a version that changes it resets state.

    A new threshold or emit mode keeps the window (it applies from the next event);
    new conditions, grouping or value fields mean old entries no longer qualify.
    `epoch` > 0: the live job's warm-up (streaming/warmup.py) refills the rule's state
    from the archive, so the state it had is dropped.
    """
    d = rule.model_dump(mode="json")
    keep = ("source_topic", "conditions", "group_by", "aggregation_field", "aggregation_type", "time_mode",
            "timestamp_field", "context_topic", "correlation_key", "context_value_field", "context_type_field",
            "context_type_value", "event_value_field")
    out = {k: d.get(k) for k in keep}
    if epoch:
        out["warm_epoch"] = epoch
    return json.dumps(out, sort_keys=True)


def rule_spec(rule: AnyRule, signature: str) -> dict:
    """What the JVM keyed operators read of one keyed rule (RuleSpec.java): the values
    the rule model derives (window and lookback in ms, the watermark delay in ms, the
    state signature, the condition's typed value), so the JVM re-derives none of them."""
    d: dict = {
        "rule_id": rule.live_id,  # a shadow's state is its own (model.py `live_id`)
        "version": rule.version,
        "rule_type": rule.rule_type,
        "name": rule.name,
        "signature": signature,
        "uses_event_time": rule.uses_event_time,
        "timestamp_field": rule.timestamp_field,
        "window_ms": rule.window_ms,
    }
    if isinstance(rule, VelocityRule):
        d.update(
            watermark_delay_ms=int(rule.watermark_delay * 1000),
            aggregation_type=rule.aggregation_type,
            threshold=float(rule.threshold),
            emit_mode=rule.emit_mode,
            emit_to_sink=rule.emit_to_sink,
        )
    elif isinstance(rule, CorrelationRule):
        spec = value_spec(rule.condition.value)
        d.update(
            watermark_delay_ms=int(rule.watermark_delay * 1000),
            lookback_ms=rule.lookback_ms,
            velocity_filter_rule_id=rule.velocity_filter_rule_id,
            context_resolution=rule.context_resolution,
            min_context_points=rule.min_context_points,
            metric=rule.metric,
            emit_context=rule.emit_mode in ("context", "both"),
            cond_op=rule.condition.operator,
            cond_kind=spec["kind"],
            cond_num=spec["num"],
            cond_bool=spec["bool"],
            cond_str=spec["str"],
        )
    else:
        raise ValueError(f"rule {rule.rule_id} is no keyed rule ({rule.rule_type})")
    return d


# Which keyed operator of the live chain judges a rule row (KeyedRules.FIRST/SECOND): the
# second judges the correlation rules fed by a velocity rule, on the first's routed emits.
FIRST, SECOND = "first", "second"


@dataclass(frozen=True)
class WarmState:
    """How the live job starts a keyed rule's state (streaming/warmup.py): `epoch` is
    folded into its state signature, `warming` makes it fill its state without judging."""

    epoch: int = 0
    warming: bool = False


def keyed_spec(rows: Sequence[RuleRow], warm: Mapping[str, WarmState] | None = None) -> list[dict]:
    """The keyed rule rows of `rows` (velocity and correlation, one per role) as the
    evaluator's KeyedRules reads them, in the given order (an operator's input names a
    row by its index here); `warm`: the live job's warm-up state by live rule id."""
    fed = {r.rule_id for r in rows if r.route_from is not None}
    out = []
    for r in rows:
        if r.rule_type == "threshold":
            continue
        rule = parse_rule(json.loads(r.rule_json))
        state = (warm or {}).get(r.rule_id, WarmState())
        spec = rule_spec(rule, signature(rule, state.epoch))
        if state.warming:
            spec["warming"] = True
        out.append({
            "stage": SECOND if r.rule_id in fed else FIRST, "role": r.role, "topic": r.topic,
            "route_from": r.route_from, "event_time": r.event_time,
            "conditions": [_cond_spec(c) for c in r.conditions],
            # The key group: rules grouping by one path share the keys' state groups.
            "gid": r.key_path or "", "key": segments(r.key_path), "ts": segments(r.ts_path),
            "val": segments(r.val_path), "val_text": r.val_path, "val_need": r.val_need,
            # The value's JSON text goes to the operator only where a rule keeps or
            # compares it (distinct counts, a correlation's context and primaries).
            "keep_json": r.val_need == "json" or r.rule_type == "correlation",
            "rule": spec,
        })
    return out


def live_spec(rows: Sequence[RuleRow], warm: Mapping[str, WarmState] | None = None) -> str:
    """The live job's rule-set spec of every rule row in force: the threshold rules and
    the keyed rules, one version of both (rule_versions.py)."""
    threshold = [r for r in rows if r.rule_type == "threshold"]
    spec = json.loads(rule_set_spec(threshold))
    spec["keyed"] = keyed_spec(rows, warm)
    return json.dumps(spec, sort_keys=True, separators=(",", ":"), allow_nan=False)


def thresholds(spark: SparkSession, topic: Column, v: Column, spec: str) -> Column:
    """struct<m: array<int>, u: array<string>>: per event, the indexes (in the spec) of
    the threshold rules it passes, and `rule id` SKIP_SEP `reason` for each rule only a
    value it cannot read kept it from passing (a classic session: Spark Connect reaches
    the evaluator through its server plugin, `jvm_pass`)."""
    return jvm_column(spark, EVALUATOR_CLASS, "thresholds", topic, v, spec, what="the rule-set evaluator")


def live_thresholds(spark: SparkSession, topic: Column, v: Column, versions_dir: str) -> Column:
    """struct<m: array<struct<rule_id, rule_version, rule_name>>, u: array<string>>: as
    `thresholds`, the rules named by what they are, judged by the rule-set version of the
    running micro-batch, which the evaluator reads from `versions_dir`
    (streaming/rule_versions.py): the plan does not hold the rules."""
    return jvm_column(spark, EVALUATOR_CLASS, "liveThresholds", topic, v, versions_dir,
                      what="the live rule-set evaluator")


def live_keyed(spark: SparkSession, topic: Column, route_from: Column, v: Column, proc_ms: Column,
               versions_dir: str, stage: str, max_ahead_ms: int) -> Column:
    """struct<g: array<struct<gid, k, wm, mem: array<struct<i, ts, far, num, jv>>>>,
    u: array<string>, ctx: boolean>: per event, the key groups of `stage`'s keyed rules
    it enters (each entered rule row by its index in the micro-batch's version, with
    its time, number and JSON text), the entries of values the rules could not read, and
    whether the second operator's correlation rules read it as context
    (ruleplatform.rules.KeyedRules), judged by the version of the running micro-batch,
    as `live_thresholds`."""
    return jvm_column(spark, EVALUATOR_CLASS, "liveKeyed", topic, route_from, v, proc_ms, versions_dir, stage,
                      max_ahead_ms, what="the live rule-set evaluator")
