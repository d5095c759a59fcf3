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
