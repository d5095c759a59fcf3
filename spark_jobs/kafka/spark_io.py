"""Spark's own Kafka connector (`spark-sql-kafka-0-10`), with the platform's options.

The jars come from `spark_jobs.jvm` (see `spark_jobs.spark.session`). This module only
keeps the option names and the producer settings in one place, so the live job, the
benchmarks and the tests read and write Kafka the same way. (The backtest reads
recordings from files today; `read_batch` is what a topic replay would use.)

Each reader and writer names the principal it acts as (`role`):
`spark_jobs.kafka.client_config.spark_options` adds its SASL/SCRAM options
(`kafka.security.protocol`, `kafka.sasl.mechanism`, `kafka.sasl.jaas.config`) when the
platform runs with credentials, nothing on a plaintext broker.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import DataStreamWriter

from spark_jobs.kafka.client_config import spark_options

# Writes are acknowledged by every in-sync replica and de-duplicated by the broker on a
# producer retry, so a broker failover neither loses nor doubles a detection.
PRODUCER_OPTIONS: dict[str, str] = {
    "kafka.acks": "all",
    "kafka.enable.idempotence": "true",
    "kafka.linger.ms": "5",
    "kafka.compression.type": "lz4",
}


def _source_options(
    bootstrap: str,
    topics: Iterable[str],
    starting_offsets: str,
    options: Mapping[str, str] | None,
    role: str | None = None,
) -> dict[str, str]:
    names = sorted(set(topics))
    if not names:
        raise ValueError("no topics to read")
    opts = {
        "kafka.bootstrap.servers": bootstrap,
        # The exact names as a pattern, not `subscribe`: with `subscribe` Spark's offset
        # reader fails on a topic that does not exist yet (a rule may name a topic before
        # its first producer creates it); a pattern matches it once it is there, and its
        # records are read from the start.
        "subscribePattern": topic_pattern(names),
        "startingOffsets": starting_offsets,
        # Offsets that vanish (a broker that lost its log, retention past the
        # checkpoint) stop the query with a data-loss error instead of skipping.
        "failOnDataLoss": "true",
        # A broker restart (or a leader moving) must not fail the query: offset look-ups
        # are retried for a minute before the query gives up (Spark's default: 3 tries).
        "fetchOffset.numRetries": "60",
        "fetchOffset.retryIntervalMs": "1000",
        # A query reads offset ranges that exist: a fetch that finds nothing new (the
        # consumer's prefetch at the end of the log) must not hold the next one for
        # the broker's default 500 ms, which one task of every live micro-batch waited
        # (measured: the batch's scan stage 934 -> 539 ms at 300 events/s).
        "kafka.fetch.max.wait.ms": "10",
    }
    opts.update(spark_options(role))
    opts.update(options or {})
    return opts


def topic_pattern(topics: Iterable[str]) -> str:
    """A Java regex that matches exactly these topic names."""
    return "^(" + "|".join(re.escape(t) for t in sorted(set(topics))) + ")$"


def read_stream(
    spark: SparkSession,
    bootstrap: str,
    topics: Iterable[str],
    starting_offsets: str = "earliest",
    max_offsets_per_trigger: int | None = None,
    min_partitions: int | None = None,
    options: Mapping[str, str] | None = None,
    role: str | None = None,
) -> DataFrame:
    """A streaming DataFrame of Kafka records (key, value, topic, partition, offset,
    timestamp, timestampType); offsets are tracked in the query's checkpoint."""
    opts = _source_options(bootstrap, topics, starting_offsets, options, role)
    if max_offsets_per_trigger:
        opts["maxOffsetsPerTrigger"] = str(int(max_offsets_per_trigger))
    if min_partitions:
        opts["minPartitions"] = str(int(min_partitions))
    return spark.readStream.format("kafka").options(**opts).load()


def read_batch(
    spark: SparkSession,
    bootstrap: str,
    topics: Iterable[str],
    starting_offsets: str = "earliest",
    ending_offsets: str = "latest",
    options: Mapping[str, str] | None = None,
    role: str | None = None,
) -> DataFrame:
    """The records of `topics` between two offsets (default: all there is now)."""
    opts = _source_options(bootstrap, topics, starting_offsets, options, role)
    opts["endingOffsets"] = ending_offsets
    return spark.read.format("kafka").options(**opts).load()


def write_stream(df: DataFrame, bootstrap: str, options: Mapping[str, str] | None = None,
                 role: str | None = None) -> DataStreamWriter:
    """A Kafka sink for rows of (topic, key, value): each row goes to its own topic."""
    return (
        df.writeStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .options(**PRODUCER_OPTIONS)
        .options(**spark_options(role))
        .options(**dict(options or {}))
    )


def write_batch(df: DataFrame, bootstrap: str, options: Mapping[str, str] | None = None,
                role: str | None = None) -> None:
    """Write rows of (topic, key, value) to Kafka once (a batch query), with the
    stream sink's producer settings."""
    (df.write.format("kafka")
     .option("kafka.bootstrap.servers", bootstrap)
     .options(**PRODUCER_OPTIONS)
     .options(**spark_options(role))
     .options(**dict(options or {}))
     .save())
