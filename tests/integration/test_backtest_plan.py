"""The backtest's plan has the same shape whatever the number of rules and topics: the
rules are data for the live job's evaluator, judged in one call per event, and each
rule kind is one pass (issue 41: a large rule set on many topics costs what its events
cost, not a plan per topic or rule group).

The demo's rules (threshold, velocity with and without routing, a fed correlation, a
plain correlation) are copied onto topics of their own, once and six times; the
executed plans of the two rule sets must hold the same operators, node for node.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from spark_jobs.engine.events import RAW_COLUMNS, parse_events
from spark_jobs.engine.pipeline import evaluate
from spark_jobs.rules.model import parse_rule

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]


def _sets(n: int) -> list:
    demo: list[dict] = []
    for p in sorted((ROOT / "rules").glob("*.yaml")):
        doc = yaml.safe_load(p.read_text())
        demo += doc if isinstance(doc, list) else [doc]
    rules = []
    for s in range(n):
        for rule in demo:
            text = json.dumps(rule)
            for topic in {rule.get("source_topic"), rule.get("context_topic")} - {None}:
                text = text.replace(f'"{topic}"', f'"s{s}.{topic}"')
            r = json.loads(text)
            r["rule_id"] = f"s{s}_{r['rule_id']}"
            if r.get("velocity_filter_rule_id"):
                r["velocity_filter_rule_id"] = f"s{s}_{r['velocity_filter_rule_id']}"
            rules.append(parse_rule(r))
    return rules


def _operators(plan: str) -> Counter:
    """The plan's operator names (`+- Exchange hashpartitioning(...)` -> Exchange), counted."""
    names = [m.group(1) for line in plan.splitlines() if (m := re.search(r"[+:-]*\s*\*?\(?\d*\)?\s*([A-Z][A-Za-z]+)", line))]
    return Counter(names)


def test_the_plan_does_not_grow_with_rules_and_topics(spark):
    rows = [(f"s{s}.events.raw", i, json.dumps({"user_id": "u1", "type": "purchase", "amount": 5, "ts": 1_767_225_600_000}),
             None) for s in range(6) for i in range(3)]
    events, _ = parse_events(spark.createDataFrame(rows, "topic string, seq long, raw string, proc_ms long")
                             .select(*RAW_COLUMNS))
    plans = {}
    for n in (1, 6):
        rules = _sets(n)
        assert any(r.rule_type == "correlation" and r.velocity_filter_rule_id for r in rules)
        plans[n] = evaluate(events, rules).evaluated._jdf.queryExecution().executedPlan().toString()
    one, six = _operators(plans[1]), _operators(plans[6])
    # One velocity pass (planned twice: for the sink, and for the primaries it routes, which
    # the backtest runner keeps once computed) and one correlation pass.
    assert one["Exchange"] >= 2 and one["MapPartitions"] == 3
    assert six == one, (one, six)
