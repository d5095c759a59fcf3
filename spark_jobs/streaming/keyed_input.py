"""The keyed operators' input: per event, one row per key group of rules it enters,
made by the rule-set evaluator from the micro-batch's version of the rules.

The plan holds no rule. One call of the evaluator per event (`rule_set.live_keyed`,
ruleplatform.rules.KeyedRules) reads the version the batch recorded (rule_versions.py)
and returns the key groups the event enters, each with its key and the entered rule
rows (by index in that version, with the row's time, number and JSON text); the
operators read the rows' rules from the same version. So the plan has the same shape
whatever velocity and correlation rules are in force, Spark optimizes and generates
code for the same small plan at every batch, and a keyed rule change is a new version
for the next batch, not a query restart.

Why rows per key group and not per (event, rule): the rules on one key are evaluated
together by the operator (one state read and write per key, the event's text once).
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, StructType

from spark_jobs.engine.rule_set import live_keyed
from spark_jobs.streaming.keyed_rows import PASS_GID

# Separates a rule id from its reason in an unreadable-value entry (RuleSet.UNREAD_SEP).
SKIP_SEP = "\u001f"


def key_rows(events: DataFrame, stage: str, versions_dir: str, max_ahead_ms: int,
             skipped_metric: str | Observation, passing: Sequence[tuple[Column, Column]],
             unreadable: Column | None = None) -> DataFrame:
    """`stage`'s operator input from `events` (`in_topic`, `route_from`, `v`, `proc_ms`,
    `_reason`, and the event's `topic`, `seq`, `raw`): rows of `gid`, `k` (the key's
    JSON text), `mem` (the rule rows the event enters: KeyedRules.Member), `topic`,
    `seq`, `raw`, `proc_ms`, `wm` (the newest usable event time of the group's
    event-time rows, for the job watermark) and `_pass`.

    `passing`: (condition, struct) pairs, each a row carried through the operator
    unchanged where its condition holds (gid PASS_GID, the struct in `_pass`, NULL on
    the key rows); the structs are of one type. A record that is no event (`_reason`
    set) enters no key group but may be carried: a dead letter. The live plan is one
    line from its one scan of the input to the sink (job.py `build`): Spark plans a
    DataFrame that feeds two branches of a streaming query once per branch, so whatever
    does not enter an operator's keys goes through it so. A condition may read `_kctx`:
    the event is context for the second operator's correlation rules.

    The entries of values a rule could not read (`rule_id` SKIP_SEP `reason`), with
    `unreadable`'s (the threshold rules', array<string> per event), are observed per
    micro-batch as `skipped_metric` (`rows`), as job.StatusReporter adds them up.
    """
    event = F.col("_reason").isNull()
    judged = live_keyed(events.sparkSession, F.col("in_topic"), F.col("route_from"), F.when(event, F.col("v")),
                        F.col("proc_ms"), versions_dir, stage, max_ahead_ms)
    events = events.select("*", judged.alias("_k")).select("*", F.col("_k.ctx").alias("_kctx"))
    skips = F.col("_k.u") if unreadable is None else F.concat(F.col("_k.u"), unreadable)
    skipped = F.flatten(F.collect_list(F.when(F.size(skips) > F.lit(0), skips)))
    events = events.observe(skipped_metric, skipped.alias("rows"))

    # A carried row enters the explode as a group of its own (gid PASS_GID, its position
    # in `passing` as `k`) and takes its struct after it: one explode, no second type.
    group = events.schema["_k"].dataType["g"].dataType
    assert isinstance(group, ArrayType) and isinstance(group.elementType, StructType)
    marker_type = group.elementType
    markers = [F.when(cond, F.struct(F.lit(PASS_GID).alias("gid"), F.lit(str(i)).alias("k"),
                                     F.lit(None).cast("long").alias("wm"),
                                     F.lit(None).cast(marker_type["mem"].dataType).alias("mem")))
               for i, (cond, _) in enumerate(passing)]
    groups = F.concat(F.col("_k.g"), F.array(*markers)) if markers else F.col("_k.g")
    exploded = events.select("*", F.explode(groups).alias("_g")).filter(F.col("_g").isNotNull())
    carried = F.col("_g.gid") == F.lit(PASS_GID)
    out = [F.col("_g.gid").alias("gid"), F.when(~carried, F.col("_g.k")).alias("k"), F.col("_g.mem").alias("mem"),
           "topic", "seq", "raw", "proc_ms", F.col("_g.wm").alias("wm")]
    if passing:
        pass_struct: Column | None = None
        for i, (_, struct) in enumerate(passing):
            hit = carried & (F.col("_g.k") == F.lit(str(i)))
            pass_struct = F.when(hit, struct) if pass_struct is None else pass_struct.when(hit, struct)
        assert pass_struct is not None
        out.append(pass_struct.alias("_pass"))
    return exploded.select(*out)
