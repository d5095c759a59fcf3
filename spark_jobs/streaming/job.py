"""The continuous detection job (`rulectl detect`): Kafka in, detections out.

Plan of one micro-batch, one line from one scan of the input to one Kafka write:

  Kafka records (Spark's Kafka connector: the topics of the rules in force, offsets in
  the checkpoint)
    -> parse to VARIANT once
    -> every rule in force judged by the rule-set evaluator (JVM calls per event,
       engine/rule_set.py: the threshold rules, and the key groups of the keyed rules,
       keyed_input.py): per event one row per key group (the velocity and correlation
       rules on one key path) it enters, plus one row, at most, of each of: its
       threshold matches, its dead letter (a record that is no event), its context
       record for the correlation rules fed by a velocity rule (`event_rows`)
    -> the first keyed operator, keyed by (key group, bucket of the key): a Java
       StatefulProcessor on transformWithState (jvm_operator.py); the rows of no key
       group pass through it
    -> the second keyed operator, chained behind the first in every plan (`_chain`):
       correlation rules fed by a velocity rule (`velocity_filter_rule_id`) judge that
       rule's emits (`emit_to_sink: false`) of the same micro-batch and the context
       records; everything else passes through it
    -> threshold matches made detection rows (`threshold_detections`)
    -> detections / dead letters, one Kafka write with a per-row topic (sink,
       dead-letter topic)

Why one line: Spark plans a DataFrame that feeds two branches of a streaming query
once per branch, so a branch for the threshold rules, or for the context records,
would scan and parse the input once more (the plan had three scans before), and the
output of a stateful operator split into two branches would be two operators with two
states. Every plan has the same shape whatever the rules (one Kafka source, two
stateful operators), because a query restarted on its checkpoint must name the same
sources and operators: a chain that came and went with the fed correlation rules was
refused by the checkpoint.

No rule is in the plan: each micro-batch takes one version of the rule set, recorded in
the checkpoint under its id (rule_versions.py), which the evaluator and the keyed
operators read, so a rule change of any kind applies from the next batch without a new
plan or a query restart, and a batch run again after a crash judges with the versions
it had. Only the watermark delay and the subscribed topics are fixed for the process
(docs/rule-language.md, "Order, the job watermark and late events"; docs/architecture.md);
the status records them so a supervisor can restart the job when the rules need others.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import Producer
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from spark_jobs.engine.correlation import correlation_members
from spark_jobs.engine.detections import detection_id, detection_value, head_of, processed_clock
from spark_jobs.engine.events import classify, parse_variant, with_reasons
from spark_jobs.engine.rule_set import FIRST, SECOND, live_thresholds
from spark_jobs.engine.velocity import velocity_members
from spark_jobs.kafka import admin
from spark_jobs.kafka.client_config import with_bootstrap
from spark_jobs.kafka.spark_io import read_stream, write_stream
from spark_jobs.rules.model import SHADOW_SUFFIX, job_watermark_delay_s
from spark_jobs.spark import shuffle_partitions
from spark_jobs.streaming.jvm_operator import KeyBucketing, keyed_operator
from spark_jobs.streaming.keyed_input import SKIP_SEP, key_rows
from spark_jobs.streaming.keyed_rows import OUTPUT_COLUMNS, OUTPUT_SCHEMA, PASS_GID
from spark_jobs.streaming.quarantine import OffsetRange, Quarantine, quarantine_reason
from spark_jobs.streaming.registry import ROUTED_TOPIC, RuleProblem, RuleRegistry
from spark_jobs.streaming.rule_versions import prune as prune_versions
from spark_jobs.streaming.rule_versions import publish as publish_versions
from spark_jobs.streaming.rules_source import RuleRow, read_snapshot, rows_of
from spark_jobs.streaming.threshold_lane import LANE_BATCH_MS, LANE_SKIPPED, start_lane
from spark_jobs.streaming.warmup import WarmWindows, unpack

log = logging.getLogger(__name__)

STATE_STORE = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


# The principal the job's every Kafka client acts as (spark_jobs/kafka/security.py):
# reads every topic, writes its outputs, may not write rules.active.
ROLE = "detector"
# The real-time lane's consumers wait at the broker for their next record (Kafka's
# default 500 ms) instead of the micro-batch reads' 10 ms (spark_io._source_options): a
# lane task polls for as long as its batch lasts, and with 10 ms every idle partition
# sent about a hundred fetches a second. The broker answers a waiting fetch as soon as
# a record arrives, so the wait adds no latency (bench_lane_idle.py, bench_lanes.py).
LANE_FETCH = {"kafka.fetch.max.wait.ms": "500"}


@dataclass
class DetectConfig:
    bootstrap: str = "127.0.0.1:9092"
    sink_topic: str = "events.processed"
    dead_letter_topic: str = "events.deadletter"
    rules_topic: str = "rules.active"
    status_topic: str = "detect.status"
    # Detections of shadow versions (rule mode `shadow`): never the sink.
    shadow_topic: str = "events.shadow"
    # Archived events replayed into a warming rule's state (warmup.py): read by the keyed
    # query in every plan, written by its driver.
    warmup_topic: str = "detect.warmup"
    # The event archive (Delta) a warm-up reads first; None or absent: Kafka only.
    archive: str | None = None
    checkpoint: Path = Path("var/detect/checkpoint")
    trigger_ms: int = 500
    max_offsets_per_trigger: int = 100_000
    starting_offsets: str = "earliest"
    # Off only by the operator's choice (`--allow-data-loss`): then a log that lost
    # records (or went back) is read from what is there instead of stopping the job.
    fail_on_data_loss: bool = True
    master: str | None = None
    status_file: Path | None = None
    # Keys of a key group are spread over this many buckets (one operator call per bucket
    # and micro-batch); fixed for a checkpoint (recorded in it), 0: the default.
    key_buckets: int = 0
    # Where the threshold rules run: "micro-batch" (in the keyed query) or "real-time"
    # (a query of their own in Spark's real-time mode: threshold_lane.py).
    threshold_lane: str = "micro-batch"
    # How long the real-time lane's batches last (threshold_lane.py): a threshold rule
    # change waits for the next one; each batch costs its planning and task launches.
    lane_batch_ms: int = LANE_BATCH_MS

    @property
    def state_dir(self) -> Path:
        return self.checkpoint / "rules"

    @property
    def versions_dir(self) -> Path:
        """The rule-set versions (rule_versions.py) of the keyed query's batches."""
        return (self.state_dir / "versions").resolve()

    @property
    def lane_versions_dir(self) -> Path:
        """The real-time lane's (threshold_lane.py): a directory of its own, since each
        query numbers its batches from 0."""
        return (self.state_dir / "lane-versions").resolve()

    def version_dirs(self) -> list[Path]:
        """Where a new rule-set version is published: each running query's directory."""
        return [self.versions_dir, self.lane_versions_dir] if self.real_time else [self.versions_dir]

    @property
    def real_time(self) -> bool:
        return self.threshold_lane == "real-time"

    @property
    def status_path(self) -> Path:
        return self.status_file or (self.checkpoint / "status.json")


# Each (key group, bucket) of a micro-batch is one call of the keyed operator. When it
# was (rule, bucket): with 12 keyed rules, 32 buckets were 384 calls a batch, and 4
# sustained about 10% more events/s in bench_detect.py.
DEFAULT_KEY_BUCKETS = 4
BUCKETS_ENV = "DETECT_KEY_BUCKETS"


def _recorded(cfg: DetectConfig, name: str, setting: Callable[[], str], check: Callable[[str], None]) -> str:
    """A choice the checkpoint's state depends on: the value recorded in
    `CHECKPOINT/name` at the first start wins over a later setting; the first start
    records `setting()` (after `check`, which also guards a recorded value)."""
    path = cfg.checkpoint / name
    recorded = path.exists()
    value = path.read_text().strip() if recorded else setting()
    check(value)
    if not recorded:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(value)
        tmp.replace(path)
    return value


def key_buckets(cfg: DetectConfig) -> int:
    """The bucket count of this checkpoint: a key's state lives in its bucket, so the
    count recorded at the first start wins over a later setting."""

    def check(v: str) -> None:
        if int(v) < 1:
            raise ValueError(f"key buckets must be >= 1, not {v}")

    return int(_recorded(cfg, "key_buckets",
                         lambda: str(cfg.key_buckets or int(os.environ.get(BUCKETS_ENV) or DEFAULT_KEY_BUCKETS)), check))


def key_bucketing(cfg: DetectConfig, spark: SparkSession) -> KeyBucketing:
    """How this checkpoint spreads keys over the keyed operators' groups: its bucket
    count (`key_buckets`) and, recorded at its first start, the shuffle partitions the
    buckets are balanced over (Spark keeps a checkpoint's stateful partitioning whatever
    the session says later)."""
    count = key_buckets(cfg)

    def check(v: str) -> None:
        if int(v) < 1:
            raise ValueError(f"key balance must be a partition count >= 1, not {v}")

    return KeyBucketing(count, int(_recorded(cfg, "key_balance", lambda: str(shuffle_partitions(spark)), check)))


def _cores(spark: SparkSession) -> int:
    return max(1, int(spark.sparkContext.defaultParallelism))


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# ------------------------------------------------------------------------------ the plan


# Every PRUNE_EVERY batches, the rule-set versions of batches more than
# KEEP_BATCH_VERSIONS old are forgotten: the checkpoint runs none of them again (Spark
# keeps spark.sql.streaming.minBatchesToRetain, 100 by default).
PRUNE_EVERY = 50
KEEP_BATCH_VERSIONS = 200


# The plan's shape (job.py `build`) and its keyed state's layout, recorded per
# checkpoint: a checkpoint written by another shape has other sources and stateful
# operators, which Spark would refuse or, worse, read into the wrong operator, and one of
# another state layout holds entries the operators no longer read. "line-2": one source
# reference, two keyed operators, every row through both, one state entry per key
# (ruleplatform.keyed.KeyState) in buckets balanced over the shuffle partitions. Before
# it, "line-1": the same plan, one state entry per (key, rule), plain bucket numbers;
# "chain-1": three source references (threshold, first operator, context records), two
# keyed operators. A checkpoint from before the record existed (a query ran on it) was
# written by the single operator that routed through Kafka.
PLAN_LAYOUT = "line-2"
OLD_PLAN_LAYOUT = "routed-topic"


def plan_layout(cfg: DetectConfig) -> str:
    """Fails (ValueError, before anything is started) on a checkpoint of another plan
    layout: starting on it would not resume its state."""

    def setting() -> str:
        return OLD_PLAN_LAYOUT if (cfg.checkpoint / "query").exists() else PLAN_LAYOUT

    def check(v: str) -> None:
        if v != PLAN_LAYOUT:
            raise ValueError(
                f"checkpoint {cfg.checkpoint} was written by the plan layout {v!r} and this job runs {PLAN_LAYOUT!r} "
                "(one scan of the input, two keyed operators): its state and offsets "
                "cannot be resumed; start on a new checkpoint (a new --checkpoint path), which reads the topics "
                "from --starting-offsets")

    return _recorded(cfg, "plan_layout", setting, check)


def source_topics(cfg: DetectConfig, rules_topics: list[str]) -> list[str]:
    """The topics the query subscribes to: those of the rules in force and every topic
    an earlier run of this checkpoint read.

    The subscription is fixed for a query's life and only grows: Spark's Kafka source
    reports partitions that vanish from a checkpoint's offsets as data loss, so a topic
    once read stays subscribed. A rule published later that names a topic outside the
    subscription sets `restart_required` in the status (reason `new topics`), and the
    supervisor restarts the job on its checkpoint; the new topic is read from its start.
    """
    path = cfg.checkpoint / "source_topics.json"
    before = json.loads(path.read_text()) if path.exists() else []
    topics = sorted(set(before) | set(rules_topics))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(topics))
    tmp.replace(path)
    return topics


def _input(spark: SparkSession, cfg: DetectConfig, topics: list[str], min_partitions: int = 0,
           quarantined: list[OffsetRange] | None = None, *, real_time: bool = False) -> DataFrame:
    """The source records of either query (`real_time`: the real-time lane's, which
    reads each partition in one long task, as much as arrives)."""
    raw = read_stream(
        spark,
        cfg.bootstrap,
        topics,
        starting_offsets=cfg.starting_offsets,
        max_offsets_per_trigger=None if real_time else cfg.max_offsets_per_trigger,
        # A micro-batch of one busy topic partition is split into several tasks, so
        # parsing and the rules use every core.
        min_partitions=None if real_time else min_partitions or None,
        options={**({} if cfg.fail_on_data_loss else {"failOnDataLoss": "false"}),
                 **(LANE_FETCH if real_time else {})},
        role=ROLE,
    )
    # `in_topic`/`route_from` tell a record of the source from a velocity emit routed to
    # correlation rules (the second operator's input, `_chain`), an event of its topic too.
    # A warm-up record (warmup.py, the keyed query's only) is the archived event it
    # carries, with its own topic, arrival position and broker time, for the one rule
    # its route_from names.
    value = F.col("value").cast("string")
    w = unpack(value, F.col("topic") == F.lit(cfg.warmup_topic)) if not real_time else {}

    def warm_or(name: str, live: Column) -> Column:
        return F.coalesce(w[name], live) if w else live

    topic = warm_or("topic", F.col("topic"))
    return raw.select(
        topic.alias("in_topic"),
        topic.alias("topic"),
        warm_or("seq", F.col("partition").cast("long") * F.lit(1 << 40) + F.col("offset")).alias("seq"),
        (w["route_from"] if w else F.lit(None).cast("string")).alias("route_from"),
        warm_or("raw", value).alias("raw"),
        warm_or("proc_ms", F.unix_millis("timestamp")).alias("proc_ms"),
        quarantine_reason(quarantined or [], "real-time batch" if real_time else "micro-batch").alias("_quarantine"),
        (w["route_from"].isNotNull() if w else F.lit(False)).alias("_warm"),
    )


# Kafka refuses records over the topic's `max.message.bytes` (1 MB by default): a
# record the sink cannot write would fail the micro-batch, and the same batch again on
# every restart. So nothing bigger than this leaves the job whole: a detection is cut
# to its rule members and id (marked `truncated`, with the event's size), a dead
# letter keeps the first DEAD_LETTER_RAW_CHARS characters of the record (with its size).
MAX_RECORD_BYTES = 900_000
DEAD_LETTER_RAW_CHARS = 100_000


def kafka_records(rows: DataFrame, kind: Column, members: Column, cfg: DetectConfig) -> DataFrame:
    """Rows with the emit columns, a kind (detection | dead) and a dead letter's reason
    -> Kafka records (topic, key, value), in projections one after the other.

    Not two branches, because a DataFrame that feeds two branches is computed once per
    branch: the operators' output split by kind would be two copies of the chain (each
    with its own state, every key processed twice) and two scans of the topics.
    """
    # A shadow version's rows name it by its live id, `<rule_id>@shadow` (`@` is no rule
    # id character): its detections go to the shadow topic, named by the rule id, with
    # `"mode":"shadow"` among their members, and their id is the one the same version
    # would give in force. One test of the id per row, in the plan whatever the rules.
    shadow = F.coalesce(F.col("rule_id").endswith(SHADOW_SUFFIX), F.lit(False)) & (kind == F.lit("detection"))
    rule_id = F.substring(F.col("rule_id"), F.lit(1), F.length("rule_id") - F.lit(len(SHADOW_SUFFIX)))
    rows = rows.withColumn("_shadow", shadow).withColumn(
        "rule_id", F.when(F.col("_shadow"), rule_id).otherwise(F.col("rule_id")))
    members = F.when(F.col("_shadow"), F.concat_ws(",", F.lit('"mode":"shadow"'), F.when(members != F.lit(""), members))
                     ).otherwise(members)
    raw_bytes = F.octet_length(F.col("raw"))
    too_big = F.coalesce(raw_bytes > F.lit(MAX_RECORD_BYTES), F.lit(False))
    det = kind == F.lit("detection")
    did = detection_id(F.col("rule_id"), F.col("rule_version"), F.col("topic"), F.col("raw"))
    cut_event = F.concat(F.lit('{"truncated":true,"event_bytes":'), raw_bytes.cast("string"), F.lit("}"))
    # The event (or its stand-in) and the members as columns of their own first:
    # detection_value reads each several times, and inlined the expression trees would
    # be copied that often into the plan that Spark optimizes, serializes and generates
    # code for at every micro-batch.
    rows = rows.select("*", F.when(too_big, cut_event).otherwise(F.col("raw")).alias("_event"),
                       members.alias("_members"))
    detection = detection_value(F.col("_event"), head_of(rows), F.col("_members"), did, processed_clock(rows.sparkSession))
    raw_cut = raw_bytes > F.lit(DEAD_LETTER_RAW_CHARS)
    dead_value = F.to_json(
        F.struct(F.col("reason").alias("reason"), F.col("rule_id").alias("rule_id"), F.col("topic"), F.col("seq"),
                 F.make_valid_utf8(F.when(raw_cut, F.substring("raw", 1, DEAD_LETTER_RAW_CHARS))
                                   .otherwise(F.col("raw"))).alias("raw"),
                 F.when(raw_cut, raw_bytes).alias("raw_bytes")),
        {"ignoreNullFields": "false"},
    )
    return rows.select(
        F.when(det & F.col("_shadow"), F.lit(cfg.shadow_topic)).when(det, F.lit(cfg.sink_topic))
        .otherwise(F.lit(cfg.dead_letter_topic)).alias("topic"),
        F.when(det, F.col("rule_id")).alias("key"),
        F.when(det, detection).otherwise(dead_value).alias("value"),
    )


def publish_rules(cfg: DetectConfig, rules: Sequence[RuleRow], warm: WarmWindows | None) -> None:
    """Make `rules` (with the warm-up state of each, warmup.py) the version the next
    batch of each query takes (rule_versions.py)."""
    plan = warm.plan(rules) if warm is not None else None
    for folder in cfg.version_dirs():
        digest = publish_versions(folder, rules, plan)
        if warm is not None and folder == cfg.versions_dir:
            warm.published(digest)


def _carry(**given: Column) -> Column:
    """A pass row's columns (OUTPUT_SCHEMA's but topic, seq and raw, which a row has of
    its own): `given`, the rest NULL."""
    types = {f.name: f.dataType for f in OUTPUT_SCHEMA.fields}
    return F.struct(*[(given[c] if c in given else F.lit(None)).cast(types[c]).alias(c) for c in _PASSED])


def event_rows(raw: DataFrame, versions_dir: Path, max_ahead_ms: int,
               skipped_metric: str | Observation = "skipped_keyed", *, thresholds: bool) -> DataFrame:
    """The first operator's input, from the one scan of the input (`raw`, classified):
    per event one row per key group of the velocity and unfed correlation rules it
    enters (keyed_input.key_rows), and rows that only pass through the operators
    (`_pass`, PASS_GID):

    - a record that is no event: once, kind "dead" (without `thresholds`, only when this
      query quarantined it: the real-time lane dead-letters the others);
    - with `thresholds`, an event that passes threshold rules: once, kind "threshold",
      the rules it passes (JSON of their ids, versions and names) in `rule_id`
      (`threshold_detections` makes them rows, behind the operators): per event, not
      per (event, rule), across the shuffles (without: the threshold rules run in the
      real-time lane, threshold_lane.py, and not here);
    - an event that the correlation rules fed by a velocity rule read as context: once,
      kind "context", judged by the second operator (`_chain`).

    Every rule is judged by the rule-set evaluator with the micro-batch's version of the
    rules (rule_set.live_thresholds and live_keyed, from `versions_dir`:
    rule_versions.py), not rules held in the plan, so the plan is the same whatever
    rules are in force. Values the rules cannot read are observed as `skipped_metric`,
    threshold rules' too.
    """
    event = F.col("_reason").isNull()
    # A record that is no event is a dead letter of the real-time lane's when it runs
    # (threshold_lane.py); one this query quarantined (quarantine.py) stays its own. A
    # warm-up record is history: it was judged (or dead-lettered) when it was live.
    live = ~F.col("_warm") if "_warm" in raw.columns else F.lit(True)
    dead = (~event & live) if thresholds else F.col("_quarantine").isNotNull()
    passing = [(dead, _carry(kind=F.lit("dead"), ts_ms=F.col("proc_ms"), reason=F.col("_reason")))]
    unreadable = None
    if thresholds:
        raw = raw.withColumn("_th", live_thresholds(raw.sparkSession, F.col("topic"), F.when(live, F.col("v")),
                                                    str(versions_dir)))
        passing.append((event & (F.size("_th.m") > F.lit(0)),
                        _carry(kind=F.lit("threshold"), rule_id=F.to_json("_th.m"), ts_ms=F.col("proc_ms"))))
        unreadable = F.col("_th.u")
    passing.append((event & F.col("_kctx"), _carry(kind=F.lit("context"), ts_ms=F.col("proc_ms"))))
    return key_rows(raw, FIRST, str(versions_dir), max_ahead_ms, skipped_metric, passing, unreadable)


_MATCHED = "array<struct<rule_id:string,rule_version:string,rule_name:string>>"


def threshold_detections(rows: DataFrame) -> DataFrame:
    """Rows of OUTPUT_SCHEMA's columns, an event's threshold matches ("threshold", the
    rules it passed as JSON in `rule_id`) among them -> one detection row per (event,
    threshold rule it passed); the other rows as they are."""
    matched = F.col("kind") == F.lit("threshold")
    rows = rows.select("*", F.explode(F.when(matched, F.from_json("rule_id", _MATCHED))
                                      .otherwise(F.array(F.lit(None)))).alias("_t"))
    identity = {"rule_id": F.col("_t.rule_id"), "rule_version": F.col("_t.rule_version"),
                "rule_type": F.lit("threshold"), "rule_name": F.col("_t.rule_name")}
    return rows.select(*[
        F.when(matched, F.lit("detection")).otherwise(F.col("kind")).alias("kind") if c == "kind"
        else F.when(matched, identity[c]).otherwise(F.col(c)).alias(c) if c in identity
        else F.col(c)
        for c in OUTPUT_COLUMNS
    ])


def _operator_input(rows: DataFrame, buckets: KeyBucketing) -> DataFrame:
    """Key rows with `_pass` -> an operator's input: the pass rows' columns spread out,
    and each row's bucket (a pass row's by its event and kind, so pass rows are handed
    on in parallel: PASS_BUCKETS groups)."""
    passes = F.col("gid") == F.lit(PASS_GID)
    return rows.select(
        *[c for c in rows.columns if c not in ("wm", "_pass")], *[F.col(f"_pass.{c}").alias(c) for c in _PASSED],
        F.when(passes, F.pmod(F.xxhash64("seq", "_pass.kind", "_pass.rule_id"), F.lit(PASS_BUCKETS)).cast("int"))
        .otherwise(buckets.bucket(rows.sparkSession, F.col("gid"), F.col("k"))).alias("bucket"),
    )


def build(spark: SparkSession, cfg: DetectConfig, watermark_delay_s: float, topics: list[str],
          rules: Sequence[RuleRow], buckets: KeyBucketing | None = None, min_partitions: int = 0,
          quarantined: list[OffsetRange] | None = None, warm: WarmWindows | None = None) -> DataFrame:
    """The whole job as one streaming DataFrame of (topic, key, value) Kafka records:
    every rule judged by the rule-set evaluator with each micro-batch's version of the
    rules (`rules`, the rule set in force, is published as the first: rule_versions.py),
    velocity and correlation through the JVM keyed operators (jvm_operator.py).

    One line from one scan of the input to one Kafka write: every event's threshold
    matches, dead letters and context records pass through both keyed operators
    (event_rows), because a DataFrame that feeds two branches of a streaming query is
    planned once per branch (the input scanned and parsed once more per branch).

    Records in `quarantined` offset ranges are dead letters, never evaluated (quarantine.py).
    The warm-up topic is read beside `topics`; `warm`: which rules warm (warmup.py).
    `buckets`: how keys spread over the keyed operators' groups (default: DEFAULT_KEY_BUCKETS,
    balanced over the session's shuffle partitions).
    """
    buckets = buckets or KeyBucketing(DEFAULT_KEY_BUCKETS, shuffle_partitions(spark))
    raw = classify(_input(spark, cfg, [*topics, cfg.warmup_topic], min_partitions, quarantined))
    raw = raw.withColumn("_reason", F.coalesce(F.col("_quarantine"), F.col("_reason")))

    delay_ms = int(watermark_delay_s * 1000)
    max_ahead_ms = max(1_000, delay_ms)
    publish_rules(cfg, rules, warm)
    # Correlation rules fed by a velocity rule (`velocity_filter_rule_id`) are the second
    # operator's; every other keyed rule is the first's (which also dead-letters late
    # rows and event-time rows without a usable timestamp).
    keyed = event_rows(raw, cfg.versions_dir, max_ahead_ms, thresholds=not cfg.real_time)
    # The job watermark: bounded out-of-orderness over the event times of the rows'
    # event-time rules (`wm`; NULL on pass rows). The metadata is then projected away so
    # Spark does not drop late rows silently; the processor dead-letters them instead.
    watermarked = keyed.withColumn("wm_ts", F.timestamp_millis(F.col("wm"))).withWatermark(
        "wm_ts", f"{delay_ms} milliseconds")
    stateful_in = _operator_input(watermarked.drop("wm_ts"), buckets)
    versions = str(cfg.versions_dir)
    first = keyed_operator(stateful_in, versions, place="first")
    out = _chain(first, buckets, versions, max_ahead_ms)
    if not cfg.real_time:  # else no row holds threshold matches: the lane renders them
        out = threshold_detections(out)

    members = F.when(F.col("rule_type") == "threshold", F.lit("")).when(
        F.col("rule_type") == "velocity", velocity_members(F.col("agg_type"), F.col("agg_value"))
    ).otherwise(
        correlation_members(
            F.coalesce(F.col("ctx_json"), F.col("ctx_num").cast("string")), F.col("metric"),
            F.col("metric_value"), F.col("ctx_record"), F.col("emit_context"),
        )
    )
    return kafka_records(out, F.col("kind"), members, cfg)


# The pass rows' columns besides the event's own (topic, seq, raw: the key rows'
# columns of the same name).
_PASSED = [c for c in OUTPUT_COLUMNS if c not in ("topic", "seq", "raw")]
# Pass rows are spread over this many groups (by the event's arrival position) so an
# operator hands them on in parallel; they hold no state.
PASS_BUCKETS = 64


def _chain(first: DataFrame, buckets: KeyBucketing, versions_dir: str, max_ahead_ms: int) -> DataFrame:
    """The second operator, present in every plan (with no rules when no correlation
    rule in force is fed by a velocity rule): the fed correlation rules of the batch's
    version on the first operator's routed emits of this micro-batch and on their context records
    (the events the first operator handed on as kind "context"); every other row of
    the first operator passes through it, in groups of their own (PASS_GID).

    A routed emit enters as the event it is (its topic and arrival position: the
    correlation's detection id is the one the backtest gives) under the in-plan label
    ROUTED_TOPIC with the velocity rule's id (`route_from`), which the routed rule rows
    test (rules_source.py); it has no broker time (`proc_ms` NULL) and is not judged late a
    second time. The emits of a velocity rule that no fed rule in force reads (disabled,
    gone) enter no rule and go nowhere (docs/rule-language.md, "Routing"). Context records
    carry no watermark of their own: the job's one watermark comes through the first operator (a second
    one would hold the job's back, by Spark's min policy, whenever a context topic is
    quieter than the primaries').
    """
    routed = F.col("kind") == F.lit("routed")
    context = F.col("kind") == F.lit("context")
    judged = routed | context
    emits = first.select(
        F.when(routed, F.lit(ROUTED_TOPIC)).when(context, F.col("topic")).alias("in_topic"), "topic", "seq",
        F.when(routed, F.col("rule_id")).alias("route_from"), "raw",
        F.when(context, F.col("ts_ms")).cast("long").alias("proc_ms"),
        F.when(~judged, F.struct(*_PASSED)).alias("_carry"),
        # Only the rows judged here are parsed again; a pass row is never looked into
        # (no parse: its `_reason` keeps it out of every key group).
        F.when(judged, parse_variant(F.col("raw"))).alias("v"),
    )
    from_first = key_rows(with_reasons(emits), SECOND, versions_dir, max_ahead_ms, "skipped_routed",
                          passing=[(F.col("_carry").isNotNull(), F.col("_carry"))])
    stateful_in = _operator_input(from_first, buckets)
    return keyed_operator(stateful_in, versions_dir, place="second")


# ------------------------------------------------------------------------------ status


class StatusReporter:
    """Writes what a supervisor needs to a status file and the status topic."""

    def __init__(self, cfg: DetectConfig, registry: RuleRegistry, watermark_delay_s: float,
                 topics: list[str] | None = None, quarantine: Quarantine | None = None,
                 warm: WarmWindows | None = None) -> None:
        self.cfg = cfg
        self.warm = warm
        self.quarantine = quarantine
        self.batch_failures = 0
        self.last_failure: dict | None = None
        self.registry = registry
        self.watermark_delay_s = watermark_delay_s
        self.topics = sorted(topics or [])
        self.unreadable: dict[str, dict[str, int]] = {}
        self.started_at = time.time()
        self.query_id: str | None = None
        self.run_id: str | None = None
        self.progress: dict | None = None
        self.state = "starting"
        # The rule set the running query evaluates, and how many rule changes applied
        # (each without a restart: a new version for the next batch).
        self.in_force: Compiled | None = None
        # A change published for the next batch, until it is in force.
        self.pending: Compiled | None = None
        self.rule_changes_live = 0
        # The real-time lane's query, when the threshold rules run there (threshold_lane.py).
        self.lane: dict | None = None
        self.lane_progress: dict | None = None
        self.lane_quarantine: Quarantine | None = None
        self._producer = Producer(with_bootstrap(cfg.bootstrap, ROLE, {"linger.ms": 5}))

    def snapshot(self) -> dict:
        rules = self.registry.current()
        needed = job_watermark_delay_s(list(rules.rules.values()))
        new_topics = sorted(set(rules.topics()) - set(self.topics))
        reasons = []
        if needed != self.watermark_delay_s:
            reasons.append(f"rules need watermark delay {needed}s, job runs with {self.watermark_delay_s}s")
        if new_topics:
            reasons.append(f"new topics: rules read {', '.join(new_topics)}, which the job does not subscribe to")
        p = self.progress or {}
        warm = self.warm.status() if self.warm is not None else {}
        loading = {k for k, w in warm.items() if w["state"] == "loading"}
        return {
            "state": self.state,
            "query_id": self.query_id,
            "run_id": self.run_id,
            "started_at": _iso(self.started_at),
            "updated_at": _iso(time.time()),
            "watermark_delay_s": self.watermark_delay_s,
            "rules_watermark_delay_s": needed,
            "restart_required": bool(reasons),
            "restart_reasons": reasons,
            "source_topics": self.topics,
            # The versions the running query judges with (a change applies once no batch
            # that may have taken the previous version runs: in_force; a keyed rule that
            # is loading its warm-up judges nothing yet: `warm_windows`), not those the
            # registry has read.
            "rule_versions": {k: v for k, v in (self.in_force.versions() if self.in_force is not None
                                                else rules.versions()).items() if k not in loading},
            "rule_versions_next": self.pending.versions() if self.pending is not None else None,
            "rule_changes_live": self.rule_changes_live,
            # Per keyed rule, how its state started (warmup.py): loading (filling from
            # the archive, no detections yet), warming (whole windows from `until`), warm, cold.
            "warm_windows": warm,
            "threshold_lane": self._lane_status(),
            "rule_problems": self.registry.problem_count,
            # Micro-batches that failed since the job started, the last failure and what
            # was done about it, and the offset ranges whose records were quarantined.
            "batch_failures": self.batch_failures,
            "last_failure": self.last_failure,
            "quarantined": [asdict(r) for r in self.quarantine.ranges()[-20:]] if self.quarantine else [],
            # Since the job started: values rules could not read, by rule and reason.
            "unreadable": self.unreadable,
            "last_batch_id": p.get("batchId"),
            "last_batch_time": p.get("timestamp"),
            "input_rows_per_second": p.get("inputRowsPerSecond"),
            "processed_rows_per_second": p.get("processedRowsPerSecond"),
            "num_input_rows": p.get("numInputRows"),
            # Where the last micro-batch's time went (addBatch, latestOffset, walCommit, ...).
            "batch_duration_ms": p.get("durationMs"),
            "lag": _lag(p),
            "watermark": (p.get("eventTime") or {}).get("watermark"),
        }

    def _lane_status(self) -> dict:
        if self.lane is None:
            return {"mode": "micro-batch"}
        p = self.lane_progress or {}
        quarantined = self.lane_quarantine.ranges()[-20:] if self.lane_quarantine else []
        return {**self.lane, "last_batch_id": p.get("batchId"), "last_batch_time": p.get("timestamp"),
                "input_rows_per_second": p.get("inputRowsPerSecond"), "lag": _lag(p),
                "quarantined": [asdict(r) for r in quarantined]}

    def count_unreadable(self, progress: dict) -> None:
        """Add one batch's observed skipped rows to the per-rule, per-reason totals."""
        metrics = progress.get("observedMetrics") or {}
        for name in ("skipped_keyed", "skipped_routed", LANE_SKIPPED):
            observed = metrics.get(name)  # a pyspark Row (or a dict, from JSON)
            try:
                rows = (observed["rows"] if observed is not None else None) or []
            except (KeyError, ValueError, AttributeError):
                log.warning("observed metric %s has no rows: %r", name, observed)
                continue
            for entry in rows:
                rule_id, _, reason = str(entry).partition(SKIP_SEP)
                per_rule = self.unreadable.setdefault(rule_id, {})
                per_rule[reason] = per_rule.get(reason, 0) + 1

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


def _lag(progress: dict) -> int | None:
    """Records on the broker that a query's last batch had not read, over its sources."""
    lag = None
    for src in progress.get("sources", []):
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
    return lag


def report_rule_problem(cfg: DetectConfig, producer: Producer, problem: RuleProblem) -> None:
    value = {"reason": problem.reason, "rule_id": problem.key, "topic": cfg.rules_topic, "seq": problem.offset,
             "raw": problem.raw}
    producer.produce(cfg.dead_letter_topic, key=problem.key.encode() if problem.key else None,
                     value=json.dumps(value).encode())
    producer.flush(5)


# ------------------------------------------------------------------------------ running


def _stop_after_batch_in_flight(query: object, timeout_s: float = 60.0) -> None:
    """Graceful stop: let the micro-batch in flight finish and commit, then stop.

    Under steady input the trigger is never idle (one batch starts as the last one
    ends), so "wait until no trigger is active" can wait forever. What is waited for is
    the end of the batch that was running when the stop was asked: a progress report
    with a newer batch id. Whatever batch starts after it is interrupted by stop() and
    runs again, from the same offsets, at the next start (nothing lost; any detection
    it already wrote is written again with the same id).
    """
    seen = (query.lastProgress or {}).get("batchId", -1)  # type: ignore[attr-defined]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and query.isActive:  # type: ignore[attr-defined]
        if not query.status.get("isTriggerActive"):  # type: ignore[attr-defined]
            break
        if (query.lastProgress or {}).get("batchId", -1) > seen:  # type: ignore[attr-defined]
            break
        time.sleep(0.02)
    query.stop()  # type: ignore[attr-defined]


@dataclass
class Compiled:
    """The rule set a running query evaluates: the registry snapshot it was built from."""

    snapshot: str

    def versions(self) -> dict[str, str]:
        return {rid: str(d.get("version")) for rid, d in sorted(json.loads(self.snapshot).items())}

    def rows(self) -> list[RuleRow]:
        return rows_of(json.loads(self.snapshot), ROUTED_TOPIC)


def _start_query(spark: SparkSession, cfg: DetectConfig, delay: float, topics: list[str],
                 quarantine: Quarantine, warm: WarmWindows | None = None) -> tuple[StreamingQuery, Compiled]:
    """Start the query with the registry's current snapshot as its first rule-set version."""
    text = read_snapshot(cfg.state_dir / "rules.json")
    rows = rows_of(json.loads(text), ROUTED_TOPIC)
    # One scan task per free slot: each task of a stage pays its fixed cost (its plan
    # deserialized, its code generated), so more tasks than slots only add that work
    # (bench_detect.py, docs/benchmarks.md). The real-time lane holds a slot per source
    # partition the whole time (`_master`). Spark's Kafka source splits a partition's
    # records only when minPartitions exceeds the partitions that have records, and a
    # partition with a small share keeps one task (KafkaOffsetRangeCalculator): one busy
    # partition beside a quiet one (events and their context topic) is split in `free`
    # tasks with free + partitions - 1.
    parts = _source_partitions(cfg, topics)
    free = max(1, _cores(spark) - (parts if cfg.real_time else 0))
    plan = build(spark, cfg, delay, topics, rows, key_bucketing(cfg, spark), min_partitions=free + parts - 1,
                 quarantined=quarantine.active_ranges(), warm=warm)
    query = (
        write_stream(plan, cfg.bootstrap, role=ROLE)
        .option("checkpointLocation", str(cfg.checkpoint / "query"))
        .trigger(processingTime=f"{cfg.trigger_ms} milliseconds")
        .queryName("detections")
        .start()
    )
    return query, Compiled(text)


def _master(cfg: DetectConfig, topics: list[str]) -> str | None:
    """The Spark master: the given one; with the real-time lane on a local master, one
    slot more per partition of the source topics, since real-time mode keeps one task
    running per partition the whole time, and the keyed lane's micro-batches need cores
    beside them."""
    master = cfg.master or os.environ.get("SPARK_MASTER")
    if master or not cfg.real_time:
        return master
    return f"local[{max(2, os.cpu_count() or 2) + _source_partitions(cfg, topics)}]"


def _source_partitions(cfg: DetectConfig, topics: list[str]) -> int:
    """The partitions of the source topics: the real-time lane's tasks."""
    known = admin.list_topics(cfg.bootstrap, role=ROLE)
    # A topic not created yet gets its first partition when it is: count it.
    return sum(max(1, len(known.get(t, []))) for t in topics)


def _last_batch(query: StreamingQuery) -> int:
    """The id of the query's last finished batch (-1 before the first), read after a
    version was published: a batch after it starts after the publish."""
    return int((query.lastProgress or {}).get("batchId", -1))


def _started_since(query: StreamingQuery, finished: int) -> bool:
    """Whether every batch still to judge an event started after the publish that
    `finished` was read at: the batch that was in flight then has finished, or no batch
    is running (a micro-batch query between triggers; the next one reads the new
    version). A batch takes its version when its first task asks (BatchVersions), so an
    event that arrives after this judges with the new version."""
    return _last_batch(query) > finished or not query.status.get("isTriggerActive", True)


def _restart_lane(spark: SparkSession, cfg: DetectConfig, topics: list[str], lane: StreamingQuery,
                  status: StatusReporter, quarantine: Quarantine) -> StreamingQuery | None:
    """The lane stopped by itself: a failure. It starts again on its checkpoint (the batch
    it was in runs again, with the versions it recorded), after a second failure of the
    same batch with that batch's records quarantined (quarantine.py); None when there is
    nothing left to quarantine (the job gives up, as for the keyed query)."""
    error = str(lane.exception())
    decision = quarantine.on_failure(error, broker_ends=lambda: _broker_ends(cfg, topics))
    assert status.lane is not None
    status.lane["failures"] += 1
    status.lane["last_failure"] = {"at": _iso(time.time()), "error": error[:2000], "action": decision}
    if decision == "give_up":
        log.error("threshold lane failed: %s", error)
        return None
    log.warning("threshold lane failed (%s); restarting it: %s", decision, error[:500])
    time.sleep(1.0)
    lane = start_lane(spark, cfg, topics, ROLE, quarantine)
    status.lane["run_id"] = str(lane.runId)
    return lane


def _broker_ends(cfg: DetectConfig, topics: list[str]) -> dict[str, dict[str, int]]:
    """topic -> partition -> the broker's end offset, for the source topics."""
    return {t: {str(p): high for p, (_, high) in admin.watermarks(cfg.bootstrap, t, role=ROLE).items()}
            for t in topics}


def run(cfg: DetectConfig, stop: threading.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT (or `stop`), then finish the batch in flight and exit 0.

    A failed micro-batch restarts the query in this process: retried once, then its
    records quarantined to the dead-letter topic (quarantine.py); exit 1 only when a
    failure is not a batch's or survives the quarantine.
    """
    from spark_jobs.spark import local_checkpoint_conf, session

    stop = stop or threading.Event()
    # Set by a rule change read by the registry and by a signal: the loop below looks at
    # once instead of at its next half second (a threshold change is due in the running
    # lane within a second of its publish).
    wake = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: (stop.set(), wake.set()))
    plan_layout(cfg)  # an old checkpoint fails here, before anything is started
    admin.create_topics(cfg.bootstrap, [cfg.sink_topic, cfg.shadow_topic, cfg.dead_letter_topic, cfg.status_topic,
                                         cfg.rules_topic, cfg.warmup_topic],
                        role=ROLE)
    dlq = Producer(with_bootstrap(cfg.bootstrap, ROLE))
    registry = RuleRegistry(cfg.bootstrap, cfg.state_dir, cfg.rules_topic, role=ROLE,
                            on_problem=lambda p: report_rule_problem(cfg, dlq, p), on_change=wake.set)
    registry.start()
    delay = job_watermark_delay_s(list(registry.current().rules.values()))
    topics = source_topics(cfg, registry.current().topics())
    master = _master(cfg, topics)
    spark = session("detection-job", master=master, streaming=True, extra={
        "spark.sql.streaming.stateStore.providerClass": STATE_STORE,
        # Each micro-batch writes a changelog of the keys it changed per state partition;
        # a full RocksDB snapshot (checkpoint, zip, upload) is made in the background every
        # few batches instead of at every batch, on the batch's path.
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # The keyed operators read and write one MapState entry per key a batch touches,
        # a few kilobytes per rule of the key: RocksDB's gets and puts are most of the
        # first operator's time. Counting the store's rows (Spark's numRowsTotal metric, which
        # the job does not report) costs a read before every write; a block cache of 64 MB
        # (Spark's default is 8 MB, per state store instance) keeps the windows of a few
        # thousand keys in memory after a snapshot flushed them to files.
        # docs/decisions/0012-keyed-lane-state-costs.md, bench_detect.py.
        "spark.sql.streaming.stateStore.rocksdb.trackTotalNumberOfRows": "false",
        "spark.sql.streaming.stateStore.rocksdb.blockCacheSizeMB": "64",
        **local_checkpoint_conf(master),
        "spark.sql.streaming.noDataMicroBatches.enabled": "true",
    })
    quarantine = Quarantine(cfg.checkpoint)
    warm = WarmWindows(spark, checkpoint=cfg.checkpoint, versions_dir=cfg.versions_dir, bootstrap=cfg.bootstrap,
                       topic=cfg.warmup_topic, archive=cfg.archive, role=ROLE,
                       max_ahead_ms=max(1_000, int(delay * 1000)), starting_offsets=cfg.starting_offsets)
    status = StatusReporter(cfg, registry, delay, topics, quarantine, warm)
    query, status.in_force = _start_query(spark, cfg, delay, topics, quarantine, warm)
    status.query_id, status.run_id, status.state = str(query.id), str(query.runId), "running"
    lane = None
    lane_quarantine = Quarantine(cfg.checkpoint, "lane")
    if cfg.real_time:
        lane = start_lane(spark, cfg, topics, ROLE, lane_quarantine)
        status.lane = {"mode": "real-time", "query_id": str(lane.id), "run_id": str(lane.runId), "failures": 0}
        status.lane_quarantine = lane_quarantine
    log.info("detection job started: query %s, watermark delay %ss", query.id, delay)
    status.publish()
    exit_code = 0
    last_batch = None
    pruned = lane_pruned = 0
    # A change published to the versions directories is in force (and the status says
    # so) only once no batch that may have taken the old version is still running: the
    # last batch id of each query (the keyed query's, the lane's) at the publish.
    pending_after = (-1, -1)
    try:
        while True:
            while query.isActive and not stop.is_set():
                wake.wait(0.5)
                wake.clear()
                p = query.lastProgress
                if p is not None and p.get("batchId") != last_batch:
                    last_batch = p.get("batchId")
                    status.progress = p
                    status.count_unreadable(p)
                lp = lane.lastProgress if lane is not None else None
                if lp is not None and lp.get("batchId") != (status.lane_progress or {}).get("batchId"):
                    status.lane_progress = lp
                    status.count_unreadable(lp)
                # The versions recorded for each query's batches.
                judged = _last_batch(query)
                if judged >= 0 and judged - pruned >= PRUNE_EVERY:
                    prune_versions(cfg.versions_dir, judged - KEEP_BATCH_VERSIONS)
                    pruned = judged
                lane_judged = _last_batch(lane) if lane is not None else -1
                if lane_judged >= 0 and lane_judged - lane_pruned >= PRUNE_EVERY:
                    prune_versions(cfg.lane_versions_dir, lane_judged - KEEP_BATCH_VERSIONS)
                    lane_pruned = lane_judged
                snapshot = read_snapshot(cfg.state_dir / "rules.json")
                if snapshot != (status.pending or status.in_force).snapshot:
                    new = Compiled(snapshot)
                    # A rule change is a new version of the rule set for the next batch
                    # of each query (rule_versions.py): no new plan, no restart.
                    publish_rules(cfg, new.rows(), warm)
                    status.pending = new
                    pending_after = (_last_batch(query), _last_batch(lane) if lane is not None else -1)
                    log.info("rules changed: versions %s from the next batch", new.versions())
                if warm.advance(query.lastProgress):
                    # A warm-up is in: the rule judges from the next batch.
                    publish_rules(cfg, (status.pending or status.in_force).rows(), warm)
                if status.pending is not None and _started_since(query, pending_after[0]) and (
                        lane is None or _started_since(lane, pending_after[1])):
                    status.in_force, status.pending = status.pending, None
                    status.rule_changes_live += 1
                if lane is not None and not lane.isActive and not stop.is_set():
                    lane = _restart_lane(spark, cfg, topics, lane, status, lane_quarantine)
                    if lane is None:
                        break
                status.publish()
            if cfg.real_time and lane is None:
                _stop_after_batch_in_flight(query)
                status.state = "failed"
                exit_code = 1
                break
            if query.isActive or query.exception() is None:
                _stop_after_batch_in_flight(query)
                status.state = "stopped"
                break
            error = str(query.exception())
            decision = quarantine.on_failure(error)
            status.batch_failures += 1
            status.last_failure = {"at": _iso(time.time()), "error": error[:2000], "action": decision}
            if decision == "give_up" or stop.is_set():
                log.error("detection query failed: %s", error)
                status.state = "failed"
                exit_code = 1
                break
            log.warning("detection query failed (%s); restarting it: %s", decision, error[:500])
            query, status.in_force = _start_query(spark, cfg, delay, topics, quarantine, warm)
            status.pending = None
            status.run_id = str(query.runId)
            status.publish()
    finally:
        if lane is not None and lane.isActive:
            lane.stop()
        status.publish()
        status.close()
        registry.stop()
        dlq.flush(5)
    return exit_code
