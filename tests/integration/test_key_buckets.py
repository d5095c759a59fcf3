"""Balanced key buckets (ruleplatform.keyed.KeyBuckets): the keyed operators' groups
(gid, bucket) are hash-partitioned by Spark, and the bucket numbers are chosen so that
every shuffle partition holds the same number of each key group's buckets.

The oracle is Spark's own placement: `repartition(P, "gid", "bucket")` places a row by
the HashPartitioning a stateful operator's input is shuffled by, read back with
`spark_partition_id()`. Plain numbers 0..N-1 fail this for most key groups (where the
hash falls)."""

from __future__ import annotations

from collections import Counter

from pyspark.sql import functions as F

from spark_jobs.streaming.jvm_operator import KeyBucketing

# Key groups as the evaluator names them (a rule's key path), and a few others.
GIDS = ["$.user_id", "$.merchant", "$.card.bin", "", "$.currency_pair", *(f"$.k{i}" for i in range(15))]


def _placement(spark, bucket, partitions: int) -> dict[str, Counter]:
    """Per key group: how many distinct buckets (`bucket`: gid, key -> bucket column)
    each shuffle partition holds."""
    keys = spark.range(400).select(F.concat(F.lit('"u'), F.col("id").cast("string"), F.lit('"')).alias("k"))
    rows = keys.crossJoin(spark.createDataFrame([(g,) for g in GIDS], "gid string"))
    rows = rows.select("gid", "k", bucket(F.col("gid"), F.col("k")).alias("bucket"))
    placed = rows.repartition(partitions, "gid", "bucket").select(
        "gid", "bucket", F.spark_partition_id().alias("p")).distinct().collect()
    out: dict[str, Counter] = {g: Counter() for g in GIDS}
    for r in placed:
        out[r["gid"]][r["p"]] += 1
    return out


def test_each_partition_holds_an_equal_share_of_every_key_groups_buckets(spark):
    for count, partitions in [(4, 2), (6, 3), (8, 2)]:
        bucketing = KeyBucketing(count, partitions)
        placement = _placement(spark, lambda gid, k, b=bucketing: b.bucket(spark, gid, k), partitions)
        for gid, by_partition in placement.items():
            assert by_partition == {p: count // partitions for p in range(partitions)}, (count, partitions, gid)


def test_plain_bucket_numbers_fall_where_the_hash_puts_them(spark):
    # What balanced buckets replace (the key's hash mod 4): the same check fails for some key group.
    placement = _placement(spark, lambda gid, k: F.pmod(F.xxhash64(k), F.lit(4)).cast("int"), 2)
    assert any(by_partition != {0: 2, 1: 2} for by_partition in placement.values())


def test_a_key_keeps_its_bucket(spark):
    b = KeyBucketing(4, 2)
    df = spark.createDataFrame([("$.user_id", f'"u{i}"') for i in range(50)], "gid string, k string")
    first = [r[0] for r in df.select(b.bucket(spark, F.col("gid"), F.col("k"))).collect()]
    again = [r[0] for r in df.select(b.bucket(spark, F.col("gid"), F.col("k"))).collect()]
    assert first == again
    assert len(set(first)) == 4
