"""Threshold rules: stateless, all conditions ANDed, one emit per (event, matching rule).

All threshold rules of a topic are evaluated in a single projection (an array of the
indexes of the rules that match, exploded), so N rules cost one pass over the events,
not N scans and a union.
"""

from __future__ import annotations

from collections import defaultdict

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs.engine.conditions import all_conditions
from spark_jobs.engine.emits import explode_matching, matching, rule_table
from spark_jobs.engine.frames import union_all
from spark_jobs.engine.values import Fields
from spark_jobs.rules.model import ThresholdRule


def threshold_emits(events: DataFrame, rules: list[ThresholdRule], fields: Fields) -> DataFrame | None:
    by_topic: dict[str, list[ThresholdRule]] = defaultdict(list)
    for r in rules:
        by_topic[r.source_topic].append(r)
    outs: list[DataFrame] = []
    v = F.col("v")
    for topic, rs in sorted(by_topic.items()):
        topic_events = events.filter(F.col("topic") == topic)
        hits = matching([all_conditions(v, r.conditions, fields.values) for r in rs])
        meta = rule_table(rs)
        matched = explode_matching(topic_events, hits, ["topic", "seq", "raw", "proc_ms"])
        m = F.element_at(meta, F.col("_i") + 1)
        outs.append(
            matched.select(
                *[m[c].alias(c) for c in ("rule_id", "rule_version", "rule_type", "rule_name")],
                "topic",
                "seq",
                F.col("proc_ms").alias("ts_ms"),
                "raw",
                F.lit("").alias("extra"),
                m["head"].alias("head"),
            )
        )
    if not outs:
        return None
    return union_all(outs)
