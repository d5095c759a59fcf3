"""Threshold rules: stateless, all conditions ANDed, one emit per (event, matching rule).

The rule-set evaluator (spark_jobs/jvm, `ruleplatform.rules`) judges every threshold
rule of every topic in one call per event (`with_threshold_matches`): the plan has one
projection and one generator whatever the number of rules and topics. Classic sessions
reach it through Py4J, Spark Connect through the server's ConnectPasses plugin.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.engine.emits import rule_emits, rule_table
from spark_jobs.engine.jvm_pass import run_pass
from spark_jobs.engine.rule_set import rule_set_spec, threshold_rows
from spark_jobs.rules.model import AnyRule, ThresholdRule

MATCHES = "_tm"  # array<int>: indexes of the threshold rules an event passes


def thresholds_of(rules: list[AnyRule]) -> list[ThresholdRule]:
    """The enabled threshold rules, in the order a match's index names them."""
    return [r for r in rules if isinstance(r, ThresholdRule) and r.enabled]


def with_threshold_matches(df: DataFrame, rules: list[AnyRule]) -> DataFrame:
    """`df` (columns `topic`, `v`) with MATCHES, where `rules` hold threshold rules: done
    in the scan that parses the events, so the backtest keeps the small array, not `v`."""
    th = thresholds_of(rules)
    return run_pass(df, "thresholds", rule_set_spec(threshold_rows(th))) if th else df


def threshold_emits(events: DataFrame, rules: list[AnyRule]) -> DataFrame | None:
    th = thresholds_of(rules)
    if not th:
        return None
    if MATCHES not in events.columns:
        events = with_threshold_matches(events, th)
    m = F.element_at(rule_table(th), F.col("_i") + 1)
    matched = events.select("topic", "seq", "raw", "proc_ms", F.explode(MATCHES).alias("_i"))
    return rule_emits(matched, m, F.col("proc_ms"), F.lit(""))
