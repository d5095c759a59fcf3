"""The live plan's generated code is the same from one micro-batch to the next.

Spark caches compiled classes by their source text. A value that changes per
micro-batch and is written into the generated code as a literal (the batch time that
`current_timestamp()` becomes in a streaming query) makes the code new at every batch:
compiled again (the live job's output stage is its widest class) and run interpreted
until the JIT has seen it again. The oracle here is Spark's own count of compilations
(`CodegenMetrics`), read around micro-batches of the live plan on a real broker.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from detect_harness import job_state_store, produce

from spark_jobs.kafka.admin import create_topics
from spark_jobs.kafka.spark_io import write_stream
from spark_jobs.rules.model import parse_rule
from spark_jobs.streaming.job import DetectConfig, build
from spark_jobs.streaming.registry import ROUTED_TOPIC
from spark_jobs.streaming.rules_source import rows_of

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

RULES = [
    {"rule_id": "big", "version": "1", "rule_type": "threshold", "source_topic": "cg.events", "owner": "t",
     "conditions": [{"field": "amount", "operator": ">", "value": 10}]},
    {"rule_id": "burst", "version": "1", "rule_type": "velocity", "source_topic": "cg.events", "owner": "t",
     "group_by": "user_id", "window_size": 60, "window_unit": "seconds", "aggregation_type": "count",
     "threshold": 2, "emit_mode": "all_events", "time_mode": "event_time", "timestamp_field": "ts"},
]


def _compilations(spark) -> int:
    return int(spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME().getCount())


def _events(batch: int) -> list[str]:
    base = 1_700_000_000_000 + batch * 1_000
    return [json.dumps({"user_id": f"u{i % 3}", "amount": 5 + i * 3, "ts": base + i}) for i in range(12)]


def test_micro_batches_reuse_the_plans_compiled_code(spark, kafka_broker, tmp_path: Path):
    rules = {r["rule_id"]: parse_rule(r).model_dump(mode="json") for r in RULES}
    cfg = DetectConfig(bootstrap=kafka_broker.bootstrap, checkpoint=tmp_path / "cp", sink_topic="cg.out",
                       dead_letter_topic="cg.dead")
    rows = rows_of(rules, ROUTED_TOPIC)
    create_topics(kafka_broker.bootstrap, ["cg.out", "cg.dead"])
    produce(kafka_broker.bootstrap, "cg.events", _events(0))
    plan = build(spark, cfg, 0.0, ["cg.events"], rows)
    with job_state_store(spark):
        query = (write_stream(plan, cfg.bootstrap).option("checkpointLocation", str(cfg.checkpoint / "query"))
                 .trigger(processingTime="100 milliseconds").start())
    try:
        query.processAllAvailable()
        # Warm: every class of the plan has been compiled once (batch 0, and batch 1
        # with state to read).
        produce(kafka_broker.bootstrap, "cg.events", _events(1))
        query.processAllAvailable()
        before, first_batch = _compilations(spark), query.lastProgress["batchId"]
        for b in range(2, 6):
            time.sleep(0.2)  # a later batch time (milliseconds) than the batch before
            produce(kafka_broker.bootstrap, "cg.events", _events(b))
            query.processAllAvailable()
        batches = query.lastProgress["batchId"] - first_batch
        compiled = _compilations(spark) - before
        assert query.exception() is None
    finally:
        query.stop()
    # Each batch moves the watermark, and Spark compiles its watermark predicate with
    # the new value (one small class per batch); nothing of the plan's own code is
    # compiled again. Before, the output stage's class came new at every batch too.
    assert batches >= 4
    assert compiled <= batches, f"{compiled} classes compiled over {batches} warm micro-batches"


def _outside_generated_code(df) -> list[str]:
    """The projections and generators of `df`'s physical plan that run outside
    whole-stage code generation (no `*(n)` before them in Spark's plan text): each
    task of each batch generates such a node's code again to find it in the cache."""
    jvm = df.sparkSession._jvm
    text = jvm.org.apache.spark.sql.api.python.PythonSQLUtils.explainString(df._jdf.queryExecution(), "simple")
    nodes = [line.lstrip(" :+-") for line in text.split("== Physical Plan ==")[1].splitlines()]
    return [n[:120] for n in nodes if n.startswith(("Project [", "Generate ", "Filter "))]


@pytest.mark.parametrize("lane", ["micro-batch", "real-time"])
def test_every_projection_of_the_live_plans_is_generated_code(spark, kafka_broker, tmp_path: Path, lane: str):
    from spark_jobs.streaming.threshold_lane import lane_records

    rules = {r["rule_id"]: parse_rule(r).model_dump(mode="json") for r in RULES}
    cfg = DetectConfig(bootstrap=kafka_broker.bootstrap, checkpoint=tmp_path / "cp", threshold_lane=lane)
    plans = {"keyed": build(spark, cfg, 0.0, ["cg.events"], rows_of(rules, ROUTED_TOPIC))}
    if lane == "real-time":
        plans["lane"] = lane_records(spark, cfg, ["cg.events"], [])
    if lane == "micro-batch":
        # The threshold matches as rows (`threshold_detections`): from_json has no
        # generated code in Spark 4.2, so its explode stays outside; nothing else may.
        assert [n for n in _outside_generated_code(plans["keyed"]) if "from_json" not in n] == []
    else:
        assert {name: _outside_generated_code(df) for name, df in plans.items()} == {"keyed": [], "lane": []}
