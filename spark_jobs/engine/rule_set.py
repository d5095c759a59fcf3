"""The rule set as data for the JVM evaluator (spark_jobs/jvm, `ruleplatform.rules`).

The rule model decides what each rule says (paths, operators, what a rule value is:
`conditions.value_spec`); this module writes that down as one JSON spec per rule-set
version, which the evaluator compiles once per executor JVM. The plan that calls it has
the same shape whatever the rules: one function call per event, the spec its argument.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence

from pyspark.sql import Column, SparkSession

from spark_jobs.rules.model import AnyRule, ThresholdRule
from spark_jobs.spark import jvm_class
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


def thresholds(spark: SparkSession, topic: Column, v: Column, spec: str) -> Column:
    """struct<m: array<int>, u: array<string>>: per event, the indexes (in the spec) of
    the threshold rules it passes, and `rule id` SKIP_SEP `reason` for each rule only a
    value it cannot read kept it from passing (a classic session: Spark Connect reaches
    the evaluator through its server plugin, `jvm_pass`)."""
    from pyspark.sql.classic.column import Column as ClassicColumn

    entry = jvm_class(spark, EVALUATOR_CLASS)
    if entry is None:
        raise NotImplementedError("the rule-set evaluator on Spark Connect")
    return ClassicColumn(entry.thresholds(topic._jc, v._jc, spec))


def live_thresholds(spark: SparkSession, topic: Column, v: Column, versions_dir: str) -> Column:
    """struct<m: array<struct<rule_id, rule_version, rule_name>>, u: array<string>>: as
    `thresholds`, the rules named by what they are, judged by the rule-set version of the
    running micro-batch, which the evaluator reads from `versions_dir`
    (streaming/rule_versions.py): the plan does not hold the rules."""
    from pyspark.sql.classic.column import Column as ClassicColumn

    entry = jvm_class(spark, EVALUATOR_CLASS)
    if entry is None:
        raise NotImplementedError("the live rule-set evaluator on Spark Connect")
    return ClassicColumn(entry.liveThresholds(topic._jc, v._jc, versions_dir))
