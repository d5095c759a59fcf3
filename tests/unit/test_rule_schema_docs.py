"""The generated JSON Schema of the rule language documents every field.

Editors show a property's `description` as its help text, so a field of the rule model
without one is a field an author has to look up in docs/rule-language.md. This walks
the schema `rulectl schema` generates and names every property that lacks one.
"""

from __future__ import annotations

import json
from pathlib import Path

from spark_jobs.commands.schema import DEFAULT_PATH, render
from spark_jobs.rules.model import rule_json_schema

ROOT = Path(__file__).resolve().parents[2]


def _undocumented(node: object, path: str = "#") -> list[str]:
    missing: list[str] = []
    if isinstance(node, dict):
        for name, prop in (node.get("properties") or {}).items():
            if not (isinstance(prop, dict) and str(prop.get("description", "")).strip()):
                missing.append(f"{path}/properties/{name}")
        for key, value in node.items():
            missing.extend(_undocumented(value, f"{path}/{key}"))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            missing.extend(_undocumented(value, f"{path}[{i}]"))
    return missing


def test_every_property_of_the_rule_schema_has_a_description():
    missing = _undocumented(rule_json_schema())
    assert not missing, "rule model fields without a description (Field(description=...)): " + ", ".join(missing)


def test_every_rule_kind_and_nested_model_has_a_description():
    defs = rule_json_schema()["$defs"]
    assert {"ThresholdRule", "VelocityRule", "CorrelationRule", "Condition", "MetricCondition"} <= set(defs)
    assert all(str(d.get("description", "")).strip() for d in defs.values())


def test_the_walk_finds_a_missing_description():
    schema = {"$defs": {"X": {"properties": {"a": {"type": "string", "description": "ok"}, "b": {"type": "string"}}}}}
    assert _undocumented(schema) == ["#/$defs/X/properties/b"]


def test_committed_schema_is_what_rulectl_schema_generates():
    # Also in test_rule_validation.py; repeated here so this file alone guards the docs.
    assert json.loads((ROOT / DEFAULT_PATH).read_text()) == json.loads(render())
