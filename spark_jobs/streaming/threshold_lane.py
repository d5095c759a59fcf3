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
    -> one detection record per (event, rule it passes) -> the sink

A real-time batch lasts LANE_BATCH_S: a threshold rule change is published as the next
version and the next batch takes it (no restart), and a batch run again after a crash
takes the version it recorded, as the keyed lane's micro-batches do. Records that are
no event, and the keyed rules, stay with the keyed lane, which then judges no
threshold rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from spark_jobs.engine.events import classify
from spark_jobs.engine.rule_set import live_thresholds
from spark_jobs.kafka.spark_io import read_stream, write_stream

if TYPE_CHECKING:
    from spark_jobs.streaming.job import DetectConfig

# Seconds a real-time batch lasts: how long a rule change waits for the next one.
# bench_live_floor.py --real-time measured the stateless floor's p99 the same with 1 s
# and 20 s batches (docs/benchmarks.md).
LANE_BATCH_S = 1
# Spark refuses real-time batches shorter than this setting (5 s by default).
MIN_BATCH_CONF = "spark.sql.streaming.realTimeMode.minBatchDuration"


def lane_records(spark: SparkSession, cfg: DetectConfig, topics: list[str], role: str) -> DataFrame:
    """The lane's plan: Kafka records of `topics` -> detection records (topic, key, value)."""
    from spark_jobs.streaming.job import kafka_records

    raw = read_stream(spark, cfg.bootstrap, topics, starting_offsets=cfg.starting_offsets,
                      options=None if cfg.fail_on_data_loss else {"failOnDataLoss": "false"},
                      role=role)
    events = classify(raw.select(
        F.col("topic"),
        (F.col("partition").cast("long") * F.lit(1 << 40) + F.col("offset")).alias("seq"),
        F.col("value").cast("string").alias("raw"),
        F.unix_millis("timestamp").alias("proc_ms"),
    ))
    judged = events.select("topic", "seq", "raw", live_thresholds(
        spark, F.col("topic"), F.col("v"), str(cfg.versions_dir)).alias("_th"))
    hits = judged.select("topic", "seq", "raw", F.explode("_th.m").alias("_t"))
    rows = hits.select(
        F.col("_t.rule_id").alias("rule_id"), F.col("_t.rule_version").alias("rule_version"),
        F.lit("threshold").alias("rule_type"), F.col("_t.rule_name").alias("rule_name"),
        "topic", "seq", "raw", F.lit(None).cast("string").alias("reason"),
    )
    return kafka_records(rows, F.lit("detection"), F.lit(""), cfg)


def start_lane(spark: SparkSession, cfg: DetectConfig, topics: list[str], role: str) -> StreamingQuery:
    spark.conf.set(MIN_BATCH_CONF, f"{LANE_BATCH_S * 1000}")
    return (
        write_stream(lane_records(spark, cfg, topics, role), cfg.bootstrap, role=role)
        .option("checkpointLocation", str(cfg.checkpoint / "lane"))
        .outputMode("update")
        .trigger(realTime=f"{LANE_BATCH_S} seconds")
        .queryName("threshold-lane")
        .start()
    )
