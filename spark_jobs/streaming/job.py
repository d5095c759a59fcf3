"""The continuous detection job (`rulectl detect`): Kafka in, detections out.

Plan of one micro-batch:

  Kafka records (kafka_py, topics from the rules in force, offsets in the checkpoint)
    -> parse to VARIANT once; malformed -> dead letters
    -> join (broadcast) with the rule snapshot: one row per (event, rule it may concern)
    -> the engine's condition / key / time / value expressions, with the rule as data
    -> threshold: detections at once
    -> velocity, correlation: transformWithState keyed by (rule_id, key)
    -> detections / dead letters / routed velocity emits, one Kafka write with a
       per-row topic (sink, dead-letter topic, internal `detect.routed`)

Rule changes arrive through the snapshot and apply from the next micro-batch. Only the
watermark delay is fixed at start (DESIGN.md); the status records it so a supervisor
can restart the job when the rules need another one.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import Producer
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.engine.conditions import compare_spec
from spark_jobs.engine.correlation import correlation_members
from spark_jobs.engine.detections import render
from spark_jobs.engine.emits import EMIT_COLUMNS
from spark_jobs.engine.events import parse_events
from spark_jobs.engine.values import as_number, field, field_value, json_text, timestamp_ms
from spark_jobs.engine.velocity import velocity_members
from spark_jobs.kafka import admin
from spark_jobs.kafka.datasource import read_stream, register, write_stream
from spark_jobs.rules.model import job_watermark_delay_s
from spark_jobs.streaming.processor import OUTPUT_SCHEMA, DetectionProcessor
from spark_jobs.streaming.registry import ROUTED_TOPIC, RuleProblem, RuleRegistry
from spark_jobs.streaming.rules_source import RulesSnapshotDataSource

log = logging.getLogger(__name__)

STATE_STORE = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


@dataclass
class DetectConfig:
    bootstrap: str = "127.0.0.1:9092"
    sink_topic: str = "events.processed"
    dead_letter_topic: str = "events.deadletter"
    rules_topic: str = "rules.active"
    status_topic: str = "detect.status"
    checkpoint: Path = Path("var/detect/checkpoint")
    trigger_ms: int = 500
    max_offsets_per_trigger: int = 100_000
    starting_offsets: str = "earliest"
    master: str | None = None
    status_file: Path | None = None

    @property
    def state_dir(self) -> Path:
        return self.checkpoint / "rules"

    @property
    def status_path(self) -> Path:
        return self.status_file or (self.checkpoint / "status.json")


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# ------------------------------------------------------------------------------ the plan


def _input(spark: SparkSession, cfg: DetectConfig) -> DataFrame:
    raw = read_stream(
        spark,
        cfg.bootstrap,
        topics_file=str(cfg.state_dir / "topics.json"),
        max_offsets_per_trigger=cfg.max_offsets_per_trigger,
        starting_offsets=cfg.starting_offsets,
    )
    # Routed velocity emits carry the original topic and arrival position in their key.
    routed = F.col("topic") == F.lit(ROUTED_TOPIC)
    key = F.col("key").cast("string")
    return raw.select(
        F.col("topic").alias("in_topic"),
        F.when(routed, F.get_json_object(key, "$.topic")).otherwise(F.col("topic")).alias("topic"),
        F.when(routed, F.get_json_object(key, "$.seq").cast("long"))
        .otherwise(F.col("partition").cast("long") * F.lit(1 << 40) + F.col("offset"))
        .alias("seq"),
        F.when(routed, F.get_json_object(key, "$.from")).alias("route_from"),
        F.col("value").cast("string").alias("raw"),
        F.unix_millis("timestamp").alias("proc_ms"),
    )


def _fan_out(events: DataFrame, rules: DataFrame) -> DataFrame:
    r = rules.select(*[F.col(c).alias(f"r_{c}") for c in rules.columns])
    joined = events.join(
        F.broadcast(r),
        (events["in_topic"] == r["r_topic"])
        & (r["r_route_from"].isNull() | (r["r_route_from"] == events["route_from"])),
    )
    v = F.col("v")
    passes = F.forall(
        "r_conditions",
        lambda c: compare_spec(field_value(field(v, c["path"])), c["op"], c["kind"], c["num"], c["str"], c["flag"]),
    )
    x = field(v, F.col("r_val_path"))
    return joined.filter(passes).select(
        F.col("r_rule_id").alias("rule_id"),
        F.col("r_rule_version").alias("rule_version"),
        F.col("r_rule_type").alias("rule_type"),
        F.get_json_object("r_rule_json", "$.name").alias("rule_name"),
        F.col("r_role").alias("role"),
        F.col("r_rule_json").alias("rule_json"),
        F.col("r_event_time").alias("event_time"),
        F.col("r_val_need").alias("val_need"),
        "topic", "seq", "raw", "proc_ms",
        F.when(F.col("r_key_path").isNull(), F.lit("")).otherwise(json_text(field(v, F.col("r_key_path")))).alias("k"),
        F.when(F.col("r_ts_path").isNull(), F.col("proc_ms"))
        .otherwise(timestamp_ms(field(v, F.col("r_ts_path"))))
        .alias("ts_ms"),
        as_number(x).alias("num"),
        json_text(x).alias("jv"),
    )


def _dead(df: DataFrame, reason: Column, rule_id: Column, topic: str) -> DataFrame:
    value = F.to_json(
        F.struct(reason.alias("reason"), rule_id.alias("rule_id"), F.col("topic"), F.col("seq"), F.col("raw")),
        {"ignoreNullFields": "false"},
    )
    return df.select(F.lit(topic).alias("topic"), F.lit(None).cast("string").alias("key"), value.alias("value"))


def _rendered(emits: DataFrame, topic: str) -> DataFrame:
    d = render(emits.select(*EMIT_COLUMNS))
    return d.select(F.lit(topic).alias("topic"), F.col("rule_id").alias("key"), F.col("value"))


def build(spark: SparkSession, cfg: DetectConfig, watermark_delay_s: float) -> DataFrame:
    """The whole job as one streaming DataFrame of (topic, key, value) Kafka records."""
    register(spark)
    spark.dataSource.register(RulesSnapshotDataSource)
    events, malformed = parse_events(_input(spark, cfg))
    rules = (
        spark.read.format("rules_snapshot")
        .option("path", str(cfg.state_dir / "rules.json"))
        .option("routed_topic", ROUTED_TOPIC)
        .load()
    )
    fan = _fan_out(events, rules)

    threshold = fan.filter(F.col("rule_type") == "threshold").select(
        "rule_id", "rule_version", "rule_type", "rule_name", "topic", "seq",
        F.col("proc_ms").alias("ts_ms"), "raw", F.lit("").alias("extra"),
    )

    keyed = fan.filter(
        (F.col("rule_type") != "threshold")
        & F.col("k").isNotNull()
        & ((F.col("val_need") == "none") | ((F.col("val_need") == "num") & F.col("num").isNotNull())
           | ((F.col("val_need") == "json") & F.col("jv").isNotNull()))
    )
    no_time = keyed.filter(F.col("event_time") & F.col("ts_ms").isNull())
    timed = keyed.filter(F.col("ts_ms").isNotNull())
    # The job watermark: bounded out-of-orderness over event-time rows. The metadata is
    # then projected away (wm_ts re-derived) so Spark does not drop late rows silently;
    # the processor dead-letters them instead.
    watermarked = timed.withColumn(
        "wm_ts", F.when(F.col("event_time"), F.timestamp_millis(F.col("ts_ms")))
    ).withWatermark("wm_ts", f"{int(watermark_delay_s * 1000)} milliseconds")
    stateful_in = watermarked.select(
        "rule_id", "k", "role", "rule_json", "event_time", "ts_ms", "seq", "topic", "raw", "num", "jv"
    )
    out = stateful_in.groupBy("rule_id", "k").transformWithState(
        DetectionProcessor(), OUTPUT_SCHEMA, "Append", "EventTime"
    )

    members = F.when(
        F.col("rule_type") == "velocity", velocity_members(F.col("agg_type"), F.col("agg_value"))
    ).otherwise(
        correlation_members(
            F.coalesce(F.col("ctx_json"), F.col("ctx_num").cast("string")), F.col("metric"),
            F.col("metric_value"), F.col("ctx_record"), F.col("emit_context"),
        )
    )
    stateful_detections = out.filter(F.col("kind") == "detection").select(
        "rule_id", "rule_version", "rule_type", "rule_name", "topic", "seq", "ts_ms", "raw", members.alias("extra")
    )
    routed = out.filter(F.col("kind") == "routed").select(
        F.lit(ROUTED_TOPIC).alias("topic"),
        F.to_json(F.struct(F.col("rule_id").alias("from"), "topic", "seq")).alias("key"),
        F.col("raw").alias("value"),
    )
    late = out.filter(F.col("kind") == "dead")
    parts = [
        _rendered(threshold, cfg.sink_topic),
        _rendered(stateful_detections, cfg.sink_topic),
        routed,
        _dead(malformed, F.col("reason"), F.lit(None).cast("string"), cfg.dead_letter_topic),
        _dead(
            no_time,
            F.concat(F.lit("missing or unparseable timestamp needed by "), F.col("rule_type"), F.lit(" rule")),
            F.col("rule_id"),
            cfg.dead_letter_topic,
        ),
        _dead(late, F.col("reason"), F.col("rule_id"), cfg.dead_letter_topic),
    ]
    result = parts[0]
    for p in parts[1:]:
        result = result.unionByName(p)
    return result


# ------------------------------------------------------------------------------ status


class StatusReporter:
    """Writes what a supervisor needs to a status file and the status topic."""

    def __init__(self, cfg: DetectConfig, registry: RuleRegistry, watermark_delay_s: float) -> None:
        self.cfg = cfg
        self.registry = registry
        self.watermark_delay_s = watermark_delay_s
        self.started_at = time.time()
        self.query_id: str | None = None
        self.run_id: str | None = None
        self.progress: dict | None = None
        self.state = "starting"
        self._producer = Producer({"bootstrap.servers": cfg.bootstrap, "linger.ms": 5})

    def snapshot(self) -> dict:
        rules = self.registry.current()
        needed = job_watermark_delay_s(list(rules.rules.values()))
        p = self.progress or {}
        lag = None
        for src in p.get("sources", []):
            end, latest = src.get("endOffset"), src.get("latestOffset")
            if isinstance(end, str):
                end = json.loads(end)
            if isinstance(latest, str):
                latest = json.loads(latest)
            if isinstance(end, dict) and isinstance(latest, dict):
                lag = sum(
                    max(0, int(off) - int((end.get(t) or {}).get(part, 0)))
                    for t, parts in latest.items() for part, off in parts.items()
                )
        return {
            "state": self.state,
            "query_id": self.query_id,
            "run_id": self.run_id,
            "started_at": _iso(self.started_at),
            "updated_at": _iso(time.time()),
            "watermark_delay_s": self.watermark_delay_s,
            "rules_watermark_delay_s": needed,
            "restart_required": needed != self.watermark_delay_s,
            "rule_versions": rules.versions(),
            "rule_problems": len(self.registry.problems),
            "last_batch_id": p.get("batchId"),
            "last_batch_time": p.get("timestamp"),
            "input_rows_per_second": p.get("inputRowsPerSecond"),
            "processed_rows_per_second": p.get("processedRowsPerSecond"),
            "num_input_rows": p.get("numInputRows"),
            "lag": lag,
            "watermark": (p.get("eventTime") or {}).get("watermark"),
        }

    def publish(self) -> dict:
        snap = self.snapshot()
        path = self.cfg.status_path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(snap, indent=2))
        tmp.replace(path)
        try:
            self._producer.produce(self.cfg.status_topic, key=b"detection-job", value=json.dumps(snap).encode())
            self._producer.poll(0)
        except Exception:  # the status topic is best effort; the file is the contract
            log.exception("status topic write failed")
        return snap

    def close(self) -> None:
        self._producer.flush(5)


def report_rule_problem(cfg: DetectConfig, producer: Producer, problem: RuleProblem) -> None:
    value = {"reason": problem.reason, "rule_id": problem.key, "topic": cfg.rules_topic, "seq": problem.offset,
             "raw": problem.raw}
    producer.produce(cfg.dead_letter_topic, key=problem.key.encode() if problem.key else None,
                     value=json.dumps(value).encode())
    producer.flush(5)


# ------------------------------------------------------------------------------ running


def run(cfg: DetectConfig, stop: threading.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT (or `stop`), then finish the batch in flight and exit 0."""
    from spark_jobs.spark import session

    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    admin.create_topics(cfg.bootstrap, [cfg.sink_topic, cfg.dead_letter_topic, cfg.status_topic, ROUTED_TOPIC,
                                        cfg.rules_topic])
    dlq = Producer({"bootstrap.servers": cfg.bootstrap})
    registry = RuleRegistry(cfg.bootstrap, cfg.state_dir, cfg.rules_topic,
                            on_problem=lambda p: report_rule_problem(cfg, dlq, p))
    registry.start()
    delay = job_watermark_delay_s(list(registry.current().rules.values()))
    spark = session("detection-job", master=cfg.master, extra={
        "spark.sql.streaming.stateStore.providerClass": STATE_STORE,
        "spark.sql.streaming.noDataMicroBatches.enabled": "true",
    })
    status = StatusReporter(cfg, registry, delay)
    query = (
        write_stream(build(spark, cfg, delay), cfg.bootstrap)
        .option("checkpointLocation", str(cfg.checkpoint / "query"))
        .trigger(processingTime=f"{cfg.trigger_ms} milliseconds")
        .queryName("detections")
        .start()
    )
    status.query_id, status.run_id, status.state = str(query.id), str(query.runId), "running"
    log.info("detection job started: query %s, watermark delay %ss", query.id, delay)
    status.publish()
    exit_code = 0
    last_batch = None
    try:
        while query.isActive and not stop.is_set():
            stop.wait(0.5)
            p = query.lastProgress
            if p is not None and p.get("batchId") != last_batch:
                last_batch = p.get("batchId")
                status.progress = p
            status.publish()
        if not query.isActive and query.exception() is not None:
            log.error("detection query failed: %s", query.exception())
            status.state = "failed"
            exit_code = 1
        else:
            # Graceful: let the batch in flight finish and commit, then stop.
            deadline = time.time() + 60
            while query.status.get("isTriggerActive") and time.time() < deadline:
                time.sleep(0.05)
            query.stop()
            status.state = "stopped"
    finally:
        status.publish()
        status.close()
        registry.stop()
        dlq.flush(5)
    return exit_code
