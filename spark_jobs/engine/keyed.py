"""The backtest's keyed rules judged by the live job's evaluator: what each event enters.

The live job's keyed evaluator (ruleplatform.rules.KeyedRules) reads an event once per
operator stage and names every velocity or correlation rule row it enters, with the
row's key, time, number and JSON text. The backtest calls the same evaluator on the same
spec (`rule_set.live_spec`) in the scan that parses the events, so the backtest and the
live job cannot disagree on what enters a rule, and the plan has the same shape whatever
the number of keyed rules and topics: one call per event and stage, one explode, then
one shuffle per rule kind (velocity.py, correlation.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from spark_jobs.engine.emits import rule_table
from spark_jobs.engine.jvm_pass import run_pass
from spark_jobs.engine.rule_set import keyed_spec, live_spec
from spark_jobs.rules.model import AnyRule, CorrelationRule, ThresholdRule, VelocityRule
from spark_jobs.streaming.registry import ROUTED_TOPIC
from spark_jobs.streaming.rules_source import rule_rows

# The evaluator's verdicts of the first and second operator's rules (Evaluate.keyedPass).
FIRST, SECOND = "_k1", "_k2"


@dataclass(frozen=True)
class KeyedRows:
    """The keyed rule rows of a rule set, in the evaluator's order (a member's `_i`)."""

    spec: str  # the evaluator's spec (rule_set.live_spec)
    rules: list[AnyRule]  # the rule of each row
    kinds: list[str]  # velocity | primary | context
    owners: list[int]  # the index of the row that names the rule's detections (a velocity or primary row)

    @classmethod
    def of(cls, rules: list[AnyRule]) -> KeyedRows:
        keyed = [r for r in rules if not isinstance(r, ThresholdRule)]
        rows = [row for r in keyed for row in rule_rows(r, ROUTED_TOPIC)]
        by_id = {r.rule_id: r for r in keyed}
        owned: dict[str, int] = {}
        rules_of_rows: list[AnyRule] = []
        kinds: list[str] = []
        owners: list[int] = []
        for i, row in enumerate(keyed_spec(rows)):
            rule = by_id[row["rule"]["rule_id"]]
            kind = "velocity" if isinstance(rule, VelocityRule) else (
                "context" if row["role"] == "context" else "primary")
            if kind != "context":
                owned[rule.rule_id] = i
            rules_of_rows.append(rule)
            kinds.append(kind)
            # rule_rows gives a correlation rule's primary row before its context row.
            owners.append(owned[rule.rule_id])
        return cls(live_spec(rows), rules_of_rows, kinds, owners)

    def indexes(self, kind: str) -> list[int]:
        return [i for i, k in enumerate(self.kinds) if k == kind]

    def table(self) -> Column:
        """Per row (by `_i` + 1): its rule's identity columns and `head` (emits.rule_table),
        `kind` and `owner`."""
        return rule_table(
            self.rules, kind=self.kinds, owner=[str(o) for o in self.owners],
            agg_type=[r.aggregation_type if isinstance(r, VelocityRule) else "" for r in self.rules],
            metric=[r.metric if isinstance(r, CorrelationRule) else "" for r in self.rules],
            emit_context=[str(isinstance(r, CorrelationRule) and r.emit_mode in ("context", "both")).lower()
                          for r in self.rules],
        )

    def operator_spec(self, kind: str, spec: dict) -> str:
        """{"rules": [...]}: `spec` of the rows of `kind` (by index), null elsewhere."""
        return json.dumps({"rules": [spec[i] if k == kind else None for i, k in enumerate(self.kinds)]},
                          allow_nan=False)


def judge(events: DataFrame, keyed: KeyedRows) -> DataFrame:
    """`events` (`topic`, `v`, `proc_ms`; routed events also `in_topic`, `route_from`)
    with FIRST and SECOND: one evaluator call per event and operator stage."""
    return run_pass(events, "keyed", keyed.spec)


def entered(events: DataFrame, stage: str) -> DataFrame:
    """One row per (event, keyed rule row it enters at `stage`): topic, seq, raw,
    proc_ms, k, `_i` (the row's index), ts_ms, issue (why ts_ms is null), num, jv."""
    groups = events.select("topic", "seq", "raw", "proc_ms", F.explode(F.col(f"{stage}.g")).alias("_g"))
    members = groups.select("topic", "seq", "raw", "proc_ms", F.col("_g.k").alias("k"),
                            F.explode(F.col("_g.mem")).alias("_m"))
    return members.select("topic", "seq", "raw", "proc_ms", "k", F.col("_m.i").alias("_i"),
                          F.col("_m.ts").alias("ts_ms"), F.col("_m.issue").alias("issue"), F.col("_m.num").alias("num"), F.col("_m.jv").alias("jv"))


def untimed(rows: DataFrame, meta: Column) -> DataFrame:
    """The dead letters of entered rows without a usable time (DEAD_LETTER_COLUMNS), with
    the evaluator's reason (KeyedRules.noTime, as the live operator reports it)."""
    return rows.filter(F.col("ts_ms").isNull()).select(
        "topic", "seq", "raw", F.col("issue").alias("reason"), meta["rule_id"].alias("rule_id"))
