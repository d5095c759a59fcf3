"""The roles a rule plays in the live plan, and its definition stored by content.

Each rule becomes one row per role it plays: `source` (events of its source topic),
`context` (a correlation rule's context topic) or `routed` (a correlation rule fed by a
velocity rule's routed emits). Paths are pre-converted to JSON paths and condition
values to typed specs; compiled.py turns the rows into the plan's expressions.
"""

from __future__ import annotations

import hashlib
import json
import os
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
)

# Folder (in the job's state directory) of rule definitions by content hash: the keyed
# operator's rows name their rule by `rule_ref` instead of carrying its JSON (about
# 600 bytes copied per (event, rule) row and shuffled with each). A reference
# names one text forever, so an operator reading it later still gets the rule of its
# micro-batch, whatever the registry has written since.
RULE_DEFS = "rule_defs"


def rule_ref(rule_json: str) -> str:
    return hashlib.sha256(rule_json.encode()).hexdigest()[:32]


def rule_def_path(defs_dir: str | Path, ref: str) -> Path:
    return Path(defs_dir) / f"{ref}.json"


def write_rule_def(defs_dir: str | Path, rule_json: str) -> str:
    """Store a rule's JSON under its reference (once; the file never changes)."""
    ref = rule_ref(rule_json)
    path = rule_def_path(defs_dir, ref)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{ref}.{os.getpid()}.tmp")
        tmp.write_text(rule_json)
        os.replace(tmp, path)
    return ref


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
    rule_ref: str

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


def rule_rows(rule: AnyRule, routed_topic: str, defs_dir: str | Path | None = None) -> list[RuleRow]:
    """The roles of one rule (its definition stored in `defs_dir`, named by `rule_ref`)."""
    rj = json.dumps(rule.model_dump(mode="json"), sort_keys=True)
    ref = write_rule_def(defs_dir, rj) if defs_dir is not None else rule_ref(rj)

    def row(role: str, topic: str, event_time: bool, conditions: list[Cond], key_path: str | None,
            ts_path: str | None, val_path: str | None, val_need: str, route_from: str | None = None) -> RuleRow:
        return RuleRow(rule.rule_id, rule.version, rule.rule_type, role, topic, route_from, rj, event_time,
                       tuple(conditions), key_path, ts_path, val_path, val_need, ref)

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
