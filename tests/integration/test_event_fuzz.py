"""Property: evaluating any JSON event against any valid rule never raises.

Hypothesis draws batches of events (arbitrary JSON with the field names the rules read,
extreme numbers, NaN/Infinity literals, non-JSON text) and runs them through every
stage that reads event data: the backtest end to end, the live job's plan on a real
Spark session (its event rows: threshold matches and key groups, by the rule-set evaluator) and its keyed
operator (the JVM's, in a streaming query over the key rows). The only allowed outcomes
are detections, dead letters and counted skips.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from detect_harness import job_state_store
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from spark_jobs.backtest.inputs import InputSpec
from spark_jobs.backtest.runner import BacktestConfig, run_backtest
from spark_jobs.engine.events import classify
from spark_jobs.streaming.job import event_rows, threshold_detections
from spark_jobs.streaming.jvm_operator import keyed_operator
from spark_jobs.streaming.keyed_rows import PASS_GID
from spark_jobs.streaming.registry import ROUTED_TOPIC
from spark_jobs.streaming.rule_versions import publish
from spark_jobs.streaming.rules_source import rows_of

pytestmark = [pytest.mark.spark]

RULES = [
    {"rule_id": "t", "version": "1", "rule_type": "threshold", "source_topic": "e",
     "conditions": [{"field": "x", "operator": ">", "value": 10}, {"field": "kind", "operator": "!=", "value": "no"}]},
    {"rule_id": "v_sum", "version": "1", "rule_type": "velocity", "source_topic": "e", "group_by": "user.id",
     "window_size": 1, "window_unit": "minutes", "aggregation_type": "sum", "aggregation_field": "x", "threshold": 5,
     "time_mode": "event_time", "timestamp_field": "ts"},
    {"rule_id": "v_dc", "version": "1", "rule_type": "velocity", "source_topic": "e", "window_size": 10,
     "window_unit": "seconds", "aggregation_type": "distinct_count", "aggregation_field": "kind", "threshold": 2},
    {"rule_id": "c_z", "version": "1", "rule_type": "correlation", "source_topic": "e", "context_topic": "e",
     "correlation_key": "user.id", "window_size": 1, "window_unit": "hours", "context_resolution": "mean_std",
     "context_value_field": "rate", "event_value_field": "x", "timestamp_field": "ts", "metric": "z_score",
     "condition": {"operator": ">", "value": 1}},
    {"rule_id": "c_last", "version": "1", "rule_type": "correlation", "source_topic": "e", "context_topic": "e",
     "correlation_key": "user.id", "window_size": 1, "window_unit": "hours", "context_resolution": "last",
     "context_value_field": "rate", "event_value_field": "x", "timestamp_field": "ts", "metric": "ratio_deviation",
     "condition": {"operator": ">", "value": 0.1}},
]

SCALARS = (st.none() | st.booleans() | st.integers(min_value=-(10**40), max_value=10**40)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8)
           | st.sampled_from(["1e400", "-1e400", "NaN", "250", " 12 ", "2026-01-05T12:00:00Z", "3000-01-01T00:00:00Z"]))
VALUES = st.recursive(SCALARS, lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
                      max_leaves=6)
TIMES = st.one_of(st.integers(min_value=-(10**20), max_value=10**20), st.floats(allow_nan=False),
                  st.sampled_from([1e30, -1e30, 1767600000, 1767600000123, "2026-01-05T12:00:00+02:00", "not a time"]))
EVENT = st.fixed_dictionaries({}, optional={
    "x": VALUES, "kind": VALUES, "rate": VALUES, "ts": TIMES, "user": st.fixed_dictionaries({"id": VALUES}),
})
# Texts the JSON encoder cannot write: literals beyond JSON, and things that are no JSON.
RAW = st.sampled_from(['{"x": NaN, "ts": 1}', '{"x": Infinity}', '{"x": 1e400, "user": {"id": 1}, "ts": 1767600000}',
                      "[1, 2]", "not json", "", '{"ts": 1e999}', '{"a":' * 2000 + "1" + "}" * 2000])
LINES = st.lists(st.one_of(EVENT.map(lambda e: json.dumps(e)), RAW), min_size=1, max_size=40)


def _live_rows(spark, lines: list[str], work: Path) -> tuple[list, list]:
    rules = rows_of({r["rule_id"]: r for r in RULES}, ROUTED_TOPIC)
    raw = spark.createDataFrame([(i, line) for i, line in enumerate(lines)], "seq long, raw string").select(
        F.lit("e").alias("in_topic"), F.lit("e").alias("topic"), "seq", F.lit(None).cast("string").alias("route_from"),
        "raw", F.lit(1767600000000).cast("long").alias("proc_ms"))
    publish(work / "versions", rules)
    rows = event_rows(classify(raw), work / "versions", max_ahead_ms=5_000, thresholds=True)
    carried = rows.filter(F.col("gid") == PASS_GID).select("topic", "seq", "raw", "_pass.*")
    threshold = threshold_detections(carried).select("kind", "rule_id", "reason").collect()
    # The keyed operator as the live job calls it (event-time timers need a streaming
    # query): the key rows written to a file and read back as one micro-batch.
    src = work / "key_rows"
    rows.filter(F.col("gid") != PASS_GID).drop("_pass").coalesce(1).write.parquet(str(src))
    stream = spark.readStream.schema(spark.read.parquet(str(src)).schema).parquet(str(src))
    watermarked = stream.withColumn("wm_ts", F.timestamp_millis(F.col("wm"))).withWatermark("wm_ts", "5 seconds")
    stateful_in = watermarked.select(*[c for c in stream.columns if c != "wm"],
                                     F.pmod(F.xxhash64("k"), F.lit(2)).cast("int").alias("bucket"))
    keyed: list = []
    out = keyed_operator(stateful_in, str(work / "versions")).select("kind", "rule_id", "reason")
    with job_state_store(spark):
        q = (out.writeStream.foreachBatch(lambda df, _: keyed.extend(df.collect()))
             .option("checkpointLocation", str(work / "ckpt")).trigger(availableNow=True).start())
        q.awaitTermination(300)
    assert q.exception() is None, q.exception()
    return threshold, keyed


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                  HealthCheck.function_scoped_fixture])
@given(lines=LINES)
def test_any_event_against_any_rule_never_raises(spark, tmp_path_factory, lines):
    work: Path = tmp_path_factory.mktemp("fuzz")
    (work / "rules").mkdir()
    (work / "rules" / "rules.json").write_text(json.dumps(RULES))
    (work / "e.jsonl").write_text("\n".join(line.replace("\n", " ") for line in lines))
    summary = run_backtest(spark, BacktestConfig(work / "rules", [InputSpec("e", str(work / "e.jsonl"))], work / "bt",
                                                 time_field="ts"))
    assert isinstance(summary, dict)

    threshold, keyed = _live_rows(spark, lines, work)
    assert all(r["rule_id"] is not None if r["kind"] == "detection" else r["kind"] == "dead" and r["reason"]
               for r in threshold)
    failed = [r.asDict() for r in keyed if r["kind"] == "dead" and str(r["reason"]).startswith("rule evaluation")]
    assert not failed, failed
