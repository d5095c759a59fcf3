"""The roles a rule plays in the live plan.

Each rule becomes one row per role it plays: `source` (events of its source topic),
`context` (a correlation rule's context topic) or `routed` (a correlation rule fed by a
velocity rule's routed emits). Paths are pre-converted to JSON paths and condition
values to typed specs; engine/rule_set.py writes the rows down as the rule-set spec
the evaluator and the keyed operators read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from spark_jobs.engine.conditions import value_spec
from spark_jobs.engine.values import json_path
from spark_jobs.rules.model import (
    AnyRule,
    Condition,
    CorrelationRule,
    ThresholdRule,
    VelocityRule,
    parse_rule,
)


@dataclass(frozen=True)
class Cond:
    path: str  # a JSON path (`$['amount']`)
    op: str
    kind: str  # value_spec's kind: num | str | bool
    num: float | None
    str: str | None
    flag: bool | None


@dataclass(frozen=True)
class RuleRow:
    """One role a rule plays: which records it reads (topic, and the velocity rule a
    routed correlation rule follows) and what it reads from them."""

    rule_id: str
    rule_version: str
    rule_type: str
    role: str
    topic: str
    route_from: str | None
    rule_json: str
    event_time: bool
    conditions: tuple[Cond, ...]
    key_path: str | None
    ts_path: str | None
    val_path: str | None
    val_need: str  # what the operator needs of the value: num | json | none

    @property
    def rule_name(self) -> str | None:
        return json.loads(self.rule_json).get("name")

    def paths(self) -> set[str]:
        return {c.path for c in self.conditions} | {p for p in (self.key_path, self.ts_path, self.val_path) if p}


def _cond(c: Condition) -> Cond:
    spec = value_spec(c.value)
    return Cond(json_path(c.field), c.operator, spec["kind"], spec["num"], spec["str"], spec["bool"])


def _path(p: str | None) -> str | None:
    return json_path(p) if p else None


def rule_rows(rule: AnyRule, routed_topic: str) -> list[RuleRow]:
    """The roles of one rule."""
    rj = json.dumps(rule.model_dump(mode="json"), sort_keys=True)

    def row(role: str, topic: str, event_time: bool, conditions: list[Cond], key_path: str | None,
            ts_path: str | None, val_path: str | None, val_need: str, route_from: str | None = None) -> RuleRow:
        # A shadow version plays its roles under its live id (`<rule_id>@shadow`): its own
        # state, and the sink projection routes its detections to the shadow topic.
        return RuleRow(rule.live_id, rule.version, rule.rule_type, role, topic, route_from, rj, event_time,
                       tuple(conditions), key_path, ts_path, val_path, val_need)

    if isinstance(rule, ThresholdRule):
        return [row("source", rule.source_topic, False, [_cond(c) for c in rule.conditions], None, None, None, "none")]
    if isinstance(rule, VelocityRule):
        if rule.aggregation_type in ("sum", "avg", "min", "max"):
            need = "num"
        else:
            need = "json" if rule.aggregation_field else "none"
        ts = _path(rule.timestamp_field) if rule.uses_event_time else None
        return [row("source", rule.source_topic, rule.uses_event_time, [_cond(c) for c in rule.conditions],
                    _path(rule.group_by), ts, _path(rule.aggregation_field), need)]
    assert isinstance(rule, CorrelationRule)
    key, ts = _path(rule.correlation_key), _path(rule.timestamp_field)
    if rule.velocity_filter_rule_id:
        primary = row("routed", routed_topic, True, [], key, ts, _path(rule.event_value_field), "none",
                      route_from=rule.velocity_filter_rule_id)
    else:
        primary = row("source", rule.source_topic, True, [], key, ts, _path(rule.event_value_field), "none")
    type_filter = []
    if rule.context_type_field is not None:
        type_filter = [_cond(Condition(field=rule.context_type_field, operator="==", value=rule.context_type_value))]
    need = "num" if (rule.context_resolution != "last" or rule.metric != "direct") else "json"
    return [primary, row("context", rule.context_topic, True, type_filter, key, ts, _path(rule.context_value_field), need)]


def rows_of(rules: dict, routed_topic: str) -> list[RuleRow]:
    """The RuleRows of a registry snapshot (`rules.json`: rule id -> rule JSON)."""
    return [row for d in rules.values() for row in rule_rows(parse_rule(d), routed_topic)]


def read_snapshot(path: Path) -> str:
    """The registry's snapshot text (`{}` before the first write)."""
    return path.read_text() if path.exists() else "{}"
