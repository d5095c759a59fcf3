"""The JVM rule-set evaluator (ruleplatform.rules) against the plain-Python reference
evaluator (tests/reference_engine.py): random events, random threshold rules, the same
matches. The oracle is the reference, never the Spark engine the evaluator replaces."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F
from reference_engine import RefEvent, evaluate
from test_backtest_properties import batch, threshold_example

from spark_jobs.engine.events import RAW_COLUMNS, parse_events
from spark_jobs.engine.rule_set import rule_set_spec, threshold_rows, thresholds
from spark_jobs.rules.model import parse_rule

pytestmark = pytest.mark.spark


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_threshold_matches_equal_the_reference(spark, data):
    evs, dicts = batch(4, lambda at: threshold_example(data, at))
    rules = [parse_rule(r) for r in dicts]
    raws = [json.dumps(e) for e in evs]
    expected = {(d.rule_id, d.seq) for d in evaluate(rules, [RefEvent("e", raw, i) for i, raw in enumerate(raws)])}
    raw_df = spark.createDataFrame([("e", i, raw, None) for i, raw in enumerate(raws)],
                                   "topic string, seq long, raw string, proc_ms long").select(*RAW_COLUMNS)
    parsed, _ = parse_events(raw_df)
    spec = rule_set_spec(threshold_rows(rules))
    hits = parsed.select("seq", thresholds(spark, F.col("topic"), F.col("v"), spec).alias("j"))
    got = {(rules[i].rule_id, row["seq"]) for row in hits.collect() for i in row["j"]["m"]}
    assert got == expected


def _rule(rule_id: str, *conditions: tuple[str, str, object]) -> object:
    return parse_rule({"rule_id": rule_id, "version": "1", "rule_type": "threshold", "source_topic": "e",
                       "conditions": [{"field": f, "operator": op, "value": v} for f, op, v in conditions]})


def test_an_event_meets_the_rules_its_rarest_equality_selects(spark):
    """docs/rule-language.md (the evaluator): an event meets only the rules that could
    match it, so a thousand rules that each ask for one user and a common event type
    cost an event of one user one rule, not the thousand of its type."""
    per_user = [_rule(f"u{k}", ("type", "==", "click"), ("user", "==", f"u{k}")) for k in range(1000)]
    # Rules that only ask for the type are met by every click; one with no equality by every event.
    by_type = [_rule(f"t{k}", ("type", "==", "click"), ("amount", ">", k)) for k in range(3)]
    other = _rule("any", ("amount", ">", 5))
    rules = [*per_user, *by_type, other]
    evaluator = spark._jvm.ruleplatform.rules.RuleSet.compile(rule_set_spec(threshold_rows(rules)))
    # u7's rule, the three type rules and the rule without an equality.
    assert evaluator.tried("e", json.dumps({"type": "click", "user": "u7", "amount": 9})) == 1 + 3 + 1
    assert evaluator.tried("e", json.dumps({"type": "view", "user": "u7", "amount": 9})) == 1 + 1
    assert evaluator.tried("e", json.dumps({"type": "click", "user": "nobody"})) == 3 + 1
    assert evaluator.tried("other-topic", json.dumps({"type": "click", "user": "u7"})) == 0
