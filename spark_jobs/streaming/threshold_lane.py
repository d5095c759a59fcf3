"""The real-time lane: threshold rules in Spark's real-time mode (`--threshold-lane real-time`).

A threshold rule needs no state, so its detections need not wait for a micro-batch:
in real-time mode Spark runs one long-lived task per Kafka partition that judges and
writes each record as it arrives. The lane is its own query beside the keyed one:

  Kafka records (Spark's Kafka connector, the job's source topics, offsets in
  CHECKPOINT/lane)
    -> parse to VARIANT (events.classify)
    -> the threshold rules judged by the rule-set evaluator, with the version of the
       running batch (rule_set.live_thresholds, CHECKPOINT/rules/lane-versions:
       rule_versions.py)
    -> one detection record per (event, rule it passes) -> the sink; a record that
       is no event -> its dead letter

A real-time batch lasts `lane_batch_ms` (LANE_BATCH_MS): a threshold rule change is published as the next
version and the next batch takes it (no restart), and a batch run again after a crash
takes the version it recorded, as the keyed lane's micro-batches do. The keyed lane
then judges no threshold rule and dead-letters only the records it quarantined.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from spark_jobs.engine.events import classify
from spark_jobs.engine.rule_set import live_thresholds
from spark_jobs.kafka.spark_io import write_stream
from spark_jobs.streaming.quarantine import OffsetRange, Quarantine

if TYPE_CHECKING:
    from spark_jobs.streaming.job import DetectConfig

# Milliseconds a real-time batch lasts by default (`rulectl detect --lane-batch-ms`): how
# long a rule change waits for the next one at most (a threshold change is due in the
# lane within a second of its publish). The stateless floor's p99 was the same with
# 0.5, 1 and 20 s batches; an idle lane's batches cost CPU by the batch
# (docs/benchmarks.md, `live_floor` and `lane_idle`; decision 0011).
LANE_BATCH_MS = 500
# The observed metric of the values the lane's rules could not read.
LANE_SKIPPED = "skipped_lane"
# Spark refuses real-time batches shorter than this setting (5 s by default).
MIN_BATCH_CONF = "spark.sql.streaming.realTimeMode.minBatchDuration"


def lane_records(spark: SparkSession, cfg: DetectConfig, topics: list[str],
                 quarantined: list[OffsetRange]) -> DataFrame:
    """The lane's plan: Kafka records of `topics` -> detection records and dead letters
    (topic, key, value). A record in a `quarantined` range is a dead letter, never judged."""
    from spark_jobs.streaming import job

    events = classify(job._input(spark, cfg, topics, quarantined=quarantined, real_time=True))
    events = events.withColumn("_reason", F.coalesce(F.col("_quarantine"), F.col("_reason")))
    judged = events.select("topic", "seq", "raw", "_reason", live_thresholds(
        spark, F.col("topic"), F.col("v"), str(cfg.lane_versions_dir)).alias("_th"))
    # Per real-time batch, as the keyed query observes its own (StatusReporter.count_unreadable).
    judged = judged.observe(LANE_SKIPPED, F.flatten(F.collect_list(
        F.when(F.size("_th.u") > F.lit(0), F.col("_th.u")))).alias("rows"))
    # Per record, its rows: one per threshold rule an event passes, or its dead letter.
    # The matches themselves are exploded (no lambda over them, which Spark runs
    # without generated code); a record that is no event explodes one empty match.
    no_match = F.array(F.lit(None).cast(judged.schema["_th"].dataType["m"].dataType.elementType))
    out = judged.select("topic", "seq", "raw", "_reason",
                        F.explode(F.when(F.col("_reason").isNull(), F.col("_th.m")).otherwise(no_match)).alias("_t"))
    detection = F.col("_reason").isNull()
    rows = out.select(
        F.when(detection, F.lit("detection")).otherwise(F.lit("dead")).alias("kind"),
        "_t.rule_id", "_t.rule_version", F.when(detection, F.lit("threshold")).alias("rule_type"),
        "_t.rule_name", "topic", "seq", "raw", F.col("_reason").alias("reason"),
    )
    return job.kafka_records(rows, F.col("kind"), F.lit(""), cfg)


def start_lane(spark: SparkSession, cfg: DetectConfig, topics: list[str], role: str,
               quarantine: Quarantine) -> StreamingQuery:
    spark.conf.set(MIN_BATCH_CONF, str(cfg.lane_batch_ms))
    return (
        write_stream(lane_records(spark, cfg, topics, quarantine.active_ranges()), cfg.bootstrap, role=role)
        .option("checkpointLocation", str(cfg.checkpoint / "lane"))
        .outputMode("update")
        .trigger(realTime=f"{cfg.lane_batch_ms} milliseconds")
        .queryName("threshold-lane")
        .start()
    )
