"""The live job's keyed operator, in the JVM: velocity and correlation rules by key.

`ruleplatform.keyed.DetectionProcessor` (spark_jobs/jvm/processor) is a Java
StatefulProcessor for transformWithState: it takes the key rows of keyed_input.py plus
`bucket`, grouped by (gid, bucket), and writes OUTPUT_SCHEMA rows (keyed_rows.py). Rows
and state stay in the JVM: no row crosses to a Python worker and no state call is a
round trip.

The operator holds no rule: each input row names the rule rows its event enters by
their index in the micro-batch's rule-set version (rule_versions.py), which the
operator reads as the evaluator that made the rows did. So the plan is the same
whatever keyed rules are in force, and a rule change is a new version, not a new plan.
Its state is a MapState entry per key (its rules' sub-states), plus the bucket's timer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.spark import jvm_column
from spark_jobs.streaming.keyed_rows import CHAINED_SCHEMA, OUTPUT_SCHEMA

OPERATOR_CLASS = "ruleplatform.keyed.KeyedOperator"
BUCKETS_CLASS = "ruleplatform.keyed.KeyBuckets"


@dataclass(frozen=True)
class KeyBucketing:
    """How a key group's keys are spread over the operator's groups (gid, bucket): over
    `count` buckets by the key's hash, the bucket numbers those balanced over
    `partitions` shuffle partitions (ruleplatform.keyed.KeyBuckets: each partition gets
    count/partitions buckets of every key group). Fixed for a checkpoint (job.py
    `key_bucketing`): a key's state is under its bucket."""

    count: int
    partitions: int

    def bucket(self, spark: SparkSession, gid: Column, key: Column) -> Column:
        """int: the bucket of a key row of key group `gid` and key `key`."""
        return jvm_column(spark, BUCKETS_CLASS, "balanced", gid, F.xxhash64(key), self.count, self.partitions,
                          what="balanced key buckets")


def keyed_operator(stateful_in: DataFrame, versions_dir: str,
                   place: Literal["alone", "first", "second"] = "alone") -> DataFrame:
    """`stateful_in` (key rows with `gid`, `bucket` and the job's watermark) through the
    JVM operator: OUTPUT_SCHEMA rows, judged by the rules of each micro-batch's version
    in `versions_dir`.

    `place` in the live plan's chain (job.py `build`): "first" adds `et` (CHAINED_SCHEMA)
    for the operator behind it; "second" hands the PASS_GID groups' rows on unchanged,
    in the JVM (no round trip of every detection through Python)."""
    spark: SparkSession = stateful_in.sparkSession
    jvm = spark._jvm  # type: ignore[attr-defined]
    assert jvm is not None, "the JVM operator needs a classic (non-Connect) SparkSession"
    operator = jvm
    for part in OPERATOR_CLASS.split("."):
        operator = getattr(operator, part)
    entry = {"alone": operator.apply, "first": operator.first, "second": operator.second}[place]
    out = DataFrame(entry(stateful_in._jdf, str(versions_dir)), spark)
    schema = CHAINED_SCHEMA if place == "first" else OUTPUT_SCHEMA
    # The two definitions must not drift apart (`et` carries Spark's watermark metadata).
    if [(f.name, f.dataType) for f in out.schema.fields] != [(f.name, f.dataType) for f in schema.fields]:
        raise RuntimeError(f"JVM operator schema {out.schema} is not {schema}")
    return out
