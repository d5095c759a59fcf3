"""The continuous detection job (`rulectl detect`): Kafka in, detections out.

Plan of one micro-batch:

  Kafka records (Spark's Kafka connector: the topics of the rules in force, offsets in
  the checkpoint)
    -> parse to VARIANT once; malformed -> dead letters
    -> join (broadcast) with the rule snapshot: one row per (event, rule it may concern)
    -> the engine's condition / key / time / value expressions, with the rule as data
    -> threshold: detections at once
    -> velocity, correlation: transformWithStateInPandas keyed by (rule_id, bucket of the key);
       the bucket's keys in one state value, read and written once per batch (processor.py)
    -> detections / dead letters / routed velocity emits, one Kafka write with a
       per-row topic (sink, dead-letter topic, internal `detect.routed`)

Rule changes arrive through the snapshot and apply from the next micro-batch. Only the
watermark delay is fixed at start (DESIGN.md); the status records it so a supervisor
can restart the job when the rules need another one.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import Producer
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from spark_jobs.engine.conditions import KIND_CODES, OP_CODES, compare_spec
from spark_jobs.engine.correlation import correlation_members
from spark_jobs.engine.detections import detection_id, detection_value, head_of
from spark_jobs.engine.events import classify
from spark_jobs.engine.values import FieldValue, field, field_value, timestamp_of
from spark_jobs.engine.velocity import velocity_members
from spark_jobs.kafka import admin
from spark_jobs.kafka.client_config import with_bootstrap
from spark_jobs.kafka.spark_io import read_stream, write_stream
from spark_jobs.rules.model import job_watermark_delay_s
from spark_jobs.streaming.processor import OUTPUT_SCHEMA, DetectionProcessor
from spark_jobs.streaming.quarantine import OffsetRange, Quarantine, quarantine_reason
from spark_jobs.streaming.registry import ROUTED_TOPIC, RuleProblem, RuleRegistry
from spark_jobs.streaming.rules_source import RULE_DEFS, RulesSnapshotDataSource

log = logging.getLogger(__name__)

STATE_STORE = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


# The principal the job's every Kafka client acts as (spark_jobs/kafka/security.py):
# reads every topic, writes its outputs, may not write rules.active.
ROLE = "detector"


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
    # Off only by the operator's choice (`--allow-data-loss`): then a log that lost
    # records (or went back) is read from what is there instead of stopping the job.
    fail_on_data_loss: bool = True
    master: str | None = None
    status_file: Path | None = None
    # Keys of a rule are spread over this many buckets (one Python call per bucket and
    # micro-batch); fixed for a checkpoint (recorded in it), 0: the default.
    key_buckets: int = 0

    @property
    def state_dir(self) -> Path:
        return self.checkpoint / "rules"

    @property
    def status_path(self) -> Path:
        return self.status_file or (self.checkpoint / "status.json")


# Each (rule, bucket) of a micro-batch is one Python call with its own state read and
# write: with 12 keyed rules, 32 buckets were 384 calls a batch, and 4 sustained about
# 10% more events/s in bench_detect.py. Fewer buckets make each bucket's value (rewritten
# whole every batch) bigger; 4 keeps it near 500 keys at 2000 users.
DEFAULT_KEY_BUCKETS = 4
BUCKETS_ENV = "DETECT_KEY_BUCKETS"


def key_buckets(cfg: DetectConfig) -> int:
    """The bucket count of this checkpoint: a key's state lives in its bucket, so the
    count recorded at the first start wins over a later setting."""
    path = cfg.checkpoint / "key_buckets"
    if path.exists():
        return int(path.read_text().strip())
    n = cfg.key_buckets or int(os.environ.get(BUCKETS_ENV) or DEFAULT_KEY_BUCKETS)
    if n < 1:
        raise ValueError(f"key buckets must be >= 1, not {n}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(str(n))
    tmp.replace(path)
    return n


def _cores(spark: SparkSession) -> int:
    return max(1, int(spark.sparkContext.defaultParallelism))


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# ------------------------------------------------------------------------------ the plan


def source_topics(cfg: DetectConfig, rules_topics: list[str]) -> list[str]:
    """The topics the query subscribes to: those of the rules in force, the internal
    routing topic, and every topic an earlier run of this checkpoint read.

    The subscription is fixed for a query's life and only grows: Spark's Kafka source
    reports partitions that vanish from a checkpoint's offsets as data loss, so a topic
    once read stays subscribed. A rule published later that names a topic outside the
    subscription sets `restart_required` in the status (reason `new topics`), and the
    supervisor restarts the job on its checkpoint; the new topic is read from its start.
    """
    path = cfg.checkpoint / "source_topics.json"
    before = json.loads(path.read_text()) if path.exists() else []
    topics = sorted(set(before) | set(rules_topics) | {ROUTED_TOPIC})
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(topics))
    tmp.replace(path)
    return topics


def _input(spark: SparkSession, cfg: DetectConfig, topics: list[str], min_partitions: int = 0,
           quarantined: list[OffsetRange] | None = None) -> DataFrame:
    raw = read_stream(
        spark,
        cfg.bootstrap,
        topics,
        starting_offsets=cfg.starting_offsets,
        max_offsets_per_trigger=cfg.max_offsets_per_trigger,
        # A micro-batch of one busy topic partition is split into several tasks, so
        # parsing and the rule join use every core.
        min_partitions=min_partitions or None,
        options=None if cfg.fail_on_data_loss else {"failOnDataLoss": "false"},
        role=ROLE,
    )
    # Routed velocity emits carry the original topic and arrival position in their key.
    routed = F.col("topic") == F.lit(ROUTED_TOPIC)
    key = F.col("key").cast("string")
    return raw.select(
        F.col("topic").alias("in_topic"),
        F.when(routed, F.get_json_object(key, "$.topic")).otherwise(F.col("topic")).alias("topic"),
        F.when(routed, F.get_json_object(key, "$.seq").try_cast("long"))
        .otherwise(F.col("partition").cast("long") * F.lit(1 << 40) + F.col("offset"))
        .alias("seq"),
        F.when(routed, F.get_json_object(key, "$.from")).alias("route_from"),
        F.col("value").cast("string").alias("raw"),
        F.unix_millis("timestamp").alias("proc_ms"),
        quarantine_reason(quarantined or []).alias("_quarantine"),
    )


# Test-only fault injection: a record whose text holds this marker fails its micro-batch
# (in the JVM) unless it is quarantined; how the quarantine is proven on a real query.
FAULT_MARKER_ENV = "DETECT_FAULT_MARKER"


def _with_fault(raw: DataFrame) -> DataFrame:
    marker = os.environ.get(FAULT_MARKER_ENV)
    if not marker:
        return raw
    fails = F.col("raw").contains(F.lit(marker)) & F.col("_quarantine").isNull()
    return raw.withColumn("raw", F.when(fails, F.raise_error(F.lit(f"injected fault ({FAULT_MARKER_ENV})")))
                          .otherwise(F.col("raw")))


def _forms(x: Column) -> Column:
    """A field's VARIANT value and the forms comparisons and keys read, as one struct."""
    fv = field_value(x)
    return F.struct(x.alias("x"), fv.json.alias("json"), fv.num.alias("num"), fv.str.alias("str"))


def snapshot_shape(rules: DataFrame) -> tuple[list[str], int]:
    """Every JSON path the rule snapshot reads now (conditions, key, time, value), and
    the most conditions a rule has."""
    cond_paths = F.coalesce(F.transform("conditions", lambda c: c["path"]), F.array().cast("array<string>"))
    every = F.concat(cond_paths, F.array("key_path", "ts_path", "val_path"))
    rows = rules.select(every.alias("p"), F.size("conditions").alias("n")).collect()
    paths = sorted({p for r in rows for p in (r["p"] or []) if p is not None})
    return paths, max([r["n"] or 0 for r in rows], default=0)


def route_path(rules: DataFrame) -> str | None:
    """The path most threshold rules test with `==` against a string (e.g. an event
    type), if at least two do: the threshold join is keyed by its value as well.

    Rules are data, so the join of events with rules is keyed by topic alone, and every
    event met every rule of its topic: with 50 threshold rules, 50 condition checks per
    event although a rule on `type == "purchase"` can only pass purchases. Keyed by the
    value at this path too (the Ververica demo's routing before evaluation), an event
    meets only the rules routed to its value, plus the rules with no such condition.
    Fixed for the query's life; a rule published later on another path is simply not
    routed (all its conditions are still checked).
    """
    eq = F.filter("conditions", lambda c: (c["op"] == "==") & (c["kind"] == "str"))
    rows = rules.filter(F.col("rule_type") == "threshold").select(F.transform(eq, lambda c: c["path"]).alias("p"))
    counts: dict[str, int] = {}
    for r in rows.collect():
        for p in set(r["p"] or []):
            counts[p] = counts.get(p, 0) + 1
    best = max(counts.items(), key=lambda kv: (kv[1], kv[0]), default=None)
    return best[0] if best and best[1] >= 2 else None


# The routing key of events and rules that take part in every event's routing.
ANY_ROUTE = "\u0000any"


_ORDERING = ("<", ">", "<=", ">=")


def _unreadable(c: Column, f: Column) -> Column:
    """Condition `c` compares a number with an ordering operator and the event's value
    at its path is there but is no number (`"abc"`, a literal beyond the double range):
    the rule cannot read it, which is counted (why nothing fired), not an error."""
    return ((c["kindc"] == F.lit(KIND_CODES["num"])) & c["opc"].isin(*[OP_CODES[o] for o in _ORDERING])
            & f["json"].isNotNull() & f["num"].isNull())


def _passes(conditions: Column, fast: Column, known: Callable[[Column], Column],
            slots: int) -> tuple[Column, Column, Column]:
    """Whether an event passes all of a rule's conditions; the path of a value that
    kept it from passing because the rule could not read it (NULL when none did); and
    whether either holds (the same as `passes | blocked IS NOT NULL`, as one smaller
    expression: the plan is optimized again at every micro-batch, and its time grows
    with the size of its expressions).

    Higher-order functions (forall over the array) are evaluated interpreted, and in
    Spark 4.2 every element or field read by an interpreted expression costs a
    configuration lookup; per (event, rule) row that dominated the job. So a rule with
    at most `slots` conditions (as many as the rules had at start), all on paths read
    up front (`fast`, decided once per rule on the small side of the join), is compared
    as plain generated code; forall is only reached by the others. `known` takes a
    condition and returns the forms of its value read up front.

    The second value is set only when every other condition passes: an event that fails
    the rule anyway was not kept from firing by the unreadable value.
    """
    n = F.size(conditions)
    fixed = F.lit(True)
    fixed_or_unread = F.lit(True)
    unread_path: Column = F.lit(None).cast("string")
    for i in range(slots):
        c = F.get(conditions, i)
        f = known(c)
        ok = compare_spec(FieldValue(f["json"], f["num"], f["str"]), c["opc"], c["kindc"], c["num"], c["str"], c["flag"],
                          coded=True)
        unread = (n > F.lit(i)) & _unreadable(c, f)
        fixed = fixed & ((n <= F.lit(i)) | ok)
        fixed_or_unread = fixed_or_unread & ((n <= F.lit(i)) | ok | unread)
        unread_path = F.coalesce(unread_path, F.when(unread, c["path"]))

    def slow_ok(c: Column) -> Column:
        return compare_spec(field_value(field(F.col("v"), c["path"])), c["opc"], c["kindc"], c["num"], c["str"],
                            c["flag"], coded=True)

    def slow_unread(c: Column) -> Column:
        return _unreadable(c, _forms(field(F.col("v"), c["path"])))

    rest = F.forall(conditions, slow_ok)
    rest_or_unread = F.forall(conditions, lambda c: slow_ok(c) | slow_unread(c))
    rest_path = F.get(F.filter(conditions, slow_unread), 0)["path"]
    passes = conditions.isNotNull() & F.when(fast, fixed).otherwise(rest)
    blocked = F.when(fast, F.when(fixed_or_unread, unread_path)).otherwise(F.when(rest_or_unread, rest_path))
    either = conditions.isNotNull() & F.when(fast, fixed_or_unread).otherwise(rest_or_unread)
    return passes, F.when(conditions.isNotNull() & ~passes, blocked), either


def _fan_out(events: DataFrame, rules: DataFrame, known_paths: list[str] | None = None,
             max_conditions: int = 4, keep_malformed: bool = False, max_ahead_ms: int = 5_000,
             route: str | None = None) -> DataFrame:
    """One row per (event, rule whose conditions it passes), with the rule's key, event
    time and value read from the event.

    Paths are data (the rules), so reading a field at a path taken from a rule parses
    that path for every row. The paths known when the query starts (`known_paths`) are
    read once per event instead, as constants, into an array of their forms; each rule
    carries, per path it reads, that path's index in the array (found once per rule, on
    the small side of the join), so the per-(event, rule) work is an array access. (A
    map keyed by path cost a string comparison per entry and lookup: 11% of the JVM's
    time in the job's plan.) A rule with a path not in the array (published later)
    reads it directly: slower, same value.

    Everything that depends on the rule alone (its name, the indices) is computed on
    the rules side: per joined row it would be recomputed for every event.
    """
    v = F.col("v")
    known_paths = known_paths or ["$"]  # the array needs one entry to have its type; "$" is a valid path
    if route is not None and route not in known_paths:
        route = None
    events = events.select("*", F.array(*[_forms(field(v, F.lit(p))) for p in known_paths]).alias("_fa"))
    if route is not None:
        # Each event joins under its routing value and under ANY_ROUTE (the rules that
        # are not routed); a record that is not an event only under ANY_ROUTE, so a
        # dead letter comes out once.
        value = F.col("_fa")[known_paths.index(route)]["str"]
        keys = F.when(F.col("_reason").isNull() & value.isNotNull() & (value != F.lit(ANY_ROUTE)),
                      F.array(value, F.lit(ANY_ROUTE))).otherwise(F.array(F.lit(ANY_ROUTE)))
    else:
        keys = F.array(F.lit(ANY_ROUTE))
    events = events.select("*", F.explode(keys).alias("_route"))
    paths = F.array(*[F.lit(p) for p in known_paths])

    def index_of(path: Column) -> Column:
        # 0-based index into `_fa`; NULL when the path is not read up front.
        i = F.array_position(paths, path)
        return F.when(path.isNotNull() & (i > F.lit(0)), (i - F.lit(1)).cast("int"))

    def at(i: Column) -> Column:
        return F.col("_fa")[i]

    def lookup(path: Column, i: Column) -> Column:
        return F.when(i.isNotNull(), at(i)).otherwise(_forms(field(v, path)))

    def codes(name: Column, table: dict[str, int]) -> Column:
        out = F.lit(0)
        for key, code in table.items():
            out = F.when(name == F.lit(key), F.lit(code)).otherwise(out)
        return out

    conditions = F.transform("conditions", lambda c: c.withField("i", index_of(c["path"]))
                             .withField("opc", codes(c["op"], OP_CODES)).withField("kindc", codes(c["kind"], KIND_CODES)))
    r = rules.select(
        *[F.col(c).alias(f"r_{c}") for c in rules.columns if c != "conditions"],
        conditions.alias("r_conditions"),
        F.get_json_object("rule_json", "$.name").alias("r_rule_name"),
        ((F.size("conditions") <= F.lit(max_conditions))
         & F.forall(conditions, lambda c: c["i"].isNotNull())).alias("r_fast"),
        index_of(F.col("key_path")).alias("r_key_i"),
        index_of(F.col("ts_path")).alias("r_ts_i"),
        index_of(F.col("val_path")).alias("r_val_i"),
        F.coalesce(F.get(F.filter("conditions", lambda c: (c["path"] == F.lit(route)) & (c["op"] == "==")
                                  & (c["kind"] == "str")), 0)["str"], F.lit(ANY_ROUTE)).alias("r_route"),
    )
    passes, blocked, passes_or_blocked = _passes(F.col("r_conditions"), F.col("r_fast"), lambda c: at(c["i"]),
                                                 max_conditions)
    on = (
        (events["in_topic"] == r["r_topic"])
        & (events["_route"] == r["r_route"])
        & (r["r_route_from"].isNull() | (r["r_route_from"] == events["route_from"]))
        # Rows kept from passing only by a value the rule cannot read are joined too, to
        # be counted (`skip`) and then dropped.
        & passes_or_blocked
    )
    if keep_malformed:
        # Records that are not events come through once, with no rule, to be dead
        # letters: the same scan of the input serves both.
        joined = events.join(F.broadcast(r), on & F.col("_reason").isNull(), "left").filter(
            F.col("r_rule_id").isNotNull() | F.col("_reason").isNotNull()
        )
    else:
        joined = events.filter(F.col("_reason").isNull()).join(F.broadcast(r), on)
    extracted = joined.select(
        "*",
        F.when(~passes, F.concat(F.lit("value at "), blocked, F.lit(" is not a number"))).alias("_skip"),
        lookup(F.col("r_key_path"), F.col("r_key_i")).alias("_fk"),
        lookup(F.col("r_ts_path"), F.col("r_ts_i")).alias("_ft"),
        lookup(F.col("r_val_path"), F.col("r_val_i")).alias("_fv"),
    )
    ts = F.when(F.col("r_ts_path").isNull(), F.col("proc_ms")).otherwise(
        timestamp_of(F.col("_ft")["num"], F.col("_ft")["str"]))
    # An event time far ahead of the broker's clock would move the job watermark with it
    # and make every on-time record after it late: such a record is a dead letter for
    # the event-time rules instead (`ts_issue` is the reason the processor gives).
    too_far = (F.col("r_event_time") & ts.isNotNull() & F.col("proc_ms").isNotNull()
               & (ts > F.col("proc_ms") + F.lit(max_ahead_ms)))
    return extracted.select(
        F.col("r_rule_id").alias("rule_id"),
        F.col("r_rule_version").alias("rule_version"),
        F.col("r_rule_type").alias("rule_type"),
        F.col("r_rule_name").alias("rule_name"),
        F.col("r_role").alias("role"),
        F.col("r_rule_ref").alias("rule_ref"),
        F.col("r_event_time").alias("event_time"),
        F.col("r_val_need").alias("val_need"),
        F.col("r_key_path").alias("key_path"),
        F.col("r_val_path").alias("val_path"),
        "topic", "seq", "raw", "proc_ms", "_reason", "_skip",
        F.when(F.col("r_key_path").isNull(), F.lit("")).otherwise(F.col("_fk")["json"]).alias("k"),
        F.when(too_far, F.lit(None)).otherwise(ts).alias("ts_ms"),
        F.when(too_far, F.lit(f"event time more than {max_ahead_ms} ms ahead of the record's broker timestamp"))
        .alias("ts_issue"),
        F.col("_fv")["num"].alias("num"),
        F.col("_fv")["json"].alias("jv"),
    )


# Kafka refuses records over the topic's `max.message.bytes` (1 MB by default): a
# record the sink cannot write would fail the micro-batch, and the same batch again on
# every restart. So nothing bigger than this leaves the job whole: a detection is cut
# to its rule members and id (marked `truncated`, with the event's size), a dead
# letter keeps the first DEAD_LETTER_RAW_CHARS characters of the record (with its size).
MAX_RECORD_BYTES = 900_000
DEAD_LETTER_RAW_CHARS = 100_000


def _records(rows: DataFrame, kind: Column, members: Column, cfg: DetectConfig) -> DataFrame:
    """Rows with the emit columns, a kind (detection | routed | dead) and a dead
    letter's reason -> Kafka records (topic, key, value), in one projection.

    One projection, because a DataFrame under a union is computed once per branch: the
    stateful operator's output split by kind would be three copies of the operator
    (each with its own state, every key processed three times), the input split into
    detections and dead letters two scans of the topics.
    """
    raw_bytes = F.octet_length(F.col("raw"))
    too_big = F.coalesce(raw_bytes > F.lit(MAX_RECORD_BYTES), F.lit(False))
    det = kind == F.lit("detection")
    # A routed event must reach the correlation rules whole; one too big to route is a
    # dead letter instead.
    routed = (kind == F.lit("routed")) & ~too_big
    reason = F.when(kind == F.lit("routed"), F.lit("event too large to route to correlation rules")).otherwise(
        F.col("reason"))
    did = detection_id(F.col("rule_id"), F.col("rule_version"), F.col("topic"), F.col("raw"))
    cut_event = F.concat(F.lit('{"truncated":true,"event_bytes":'), raw_bytes.cast("string"), F.lit("}"))
    detection = detection_value(F.when(too_big, cut_event).otherwise(F.col("raw")), head_of(rows), members, did)
    routed_key = F.to_json(F.struct(F.col("rule_id").alias("from"), "topic", "seq"))
    raw_cut = raw_bytes > F.lit(DEAD_LETTER_RAW_CHARS)
    dead_value = F.to_json(
        F.struct(reason.alias("reason"), F.col("rule_id").alias("rule_id"), F.col("topic"), F.col("seq"),
                 F.make_valid_utf8(F.when(raw_cut, F.substring("raw", 1, DEAD_LETTER_RAW_CHARS))
                                   .otherwise(F.col("raw"))).alias("raw"),
                 F.when(raw_cut, raw_bytes).alias("raw_bytes")),
        {"ignoreNullFields": "false"},
    )
    return rows.select(
        F.when(det, F.lit(cfg.sink_topic)).when(routed, F.lit(ROUTED_TOPIC))
        .otherwise(F.lit(cfg.dead_letter_topic)).alias("topic"),
        F.when(det, F.col("rule_id")).when(routed, routed_key).alias("key"),
        F.when(det, detection).when(routed, F.col("raw")).otherwise(dead_value).alias("value"),
    )


SKIP_SEP = "\u001f"


def _skipped() -> Column:
    """Observed per micro-batch: `rule_id<SEP>reason` of every (event, rule) row that a
    value the rule cannot read kept from counting; the driver adds them up by rule and
    reason into the status (`unreadable`)."""
    return F.collect_list(F.when(F.col("_skip").isNotNull(), F.concat_ws(SKIP_SEP, "rule_id", "_skip"))).alias("rows")


def threshold_rows(raw: DataFrame, rules: DataFrame, known_paths: list[str], slots: int,
                   route: str | None = None) -> DataFrame:
    """Per (event, threshold rule it passes) one row, plus each record that is not an
    event once (rule_id NULL, `_reason` set); rows a value the rule cannot read kept
    from passing are counted (observed `skipped_threshold`) and dropped."""
    rows = _fan_out(raw, rules.filter(F.col("rule_type") == "threshold"), known_paths, slots, keep_malformed=True,
                    route=route)
    return rows.observe("skipped_threshold", _skipped()).filter(F.col("_skip").isNull())


def keyed_rows(raw: DataFrame, rules: DataFrame, known_paths: list[str], slots: int, max_ahead_ms: int) -> DataFrame:
    """The stateful operator's input: per (event, velocity/correlation rule it passes)
    one row with its key, time and value.

    A row without a key or a value does not enter the window (DESIGN.md: a missing value
    is no error, and most events of a shared topic lack most rules' fields). A value
    that is there but cannot be read (a non-number where the rule sums or compares
    numbers) is counted per rule and reason (observed `skipped_keyed`), so "why did
    nothing fire" has an answer in the status.
    """
    keyed = _fan_out(raw, rules.filter(F.col("rule_type") != "threshold"), known_paths, slots,
                     max_ahead_ms=max_ahead_ms)
    not_number = (F.col("val_need") == "num") & F.col("jv").isNotNull() & F.col("num").isNull()
    skip = F.coalesce(
        F.col("_skip"),
        F.when(not_number, F.concat(F.lit("value at "), F.col("val_path"), F.lit(" is not a number"))),
    )
    enters = (F.col("k").isNotNull()
              & ((F.col("val_need") == "none") | ((F.col("val_need") == "num") & F.col("num").isNotNull())
                 | ((F.col("val_need") == "json") & F.col("jv").isNotNull())))
    return keyed.withColumn("_skip", skip).observe("skipped_keyed", _skipped()).filter(
        F.col("_skip").isNull() & enters & (F.col("ts_ms").isNotNull() | F.col("event_time"))
    )


def build(spark: SparkSession, cfg: DetectConfig, watermark_delay_s: float, topics: list[str],
          buckets: int = DEFAULT_KEY_BUCKETS, min_partitions: int = 0,
          quarantined: list[OffsetRange] | None = None) -> DataFrame:
    """The whole job as one streaming DataFrame of (topic, key, value) Kafka records.

    Records in `quarantined` offset ranges are dead letters, never evaluated (quarantine.py).
    """
    spark.dataSource.register(RulesSnapshotDataSource)
    raw = classify(_with_fault(_input(spark, cfg, topics, min_partitions, quarantined)))
    raw = raw.withColumn("_reason", F.coalesce(F.col("_quarantine"), F.col("_reason")))
    rules = (
        spark.read.format("rules_snapshot")
        .option("path", str(cfg.state_dir / "rules.json"))
        .option("routed_topic", ROUTED_TOPIC)
        .option("defs_dir", str(cfg.state_dir / RULE_DEFS))
        .load()
    )
    known_paths, max_conditions = snapshot_shape(rules)
    slots = max(1, max_conditions)

    # Threshold detections and the records that are not events: one scan.
    threshold = threshold_rows(raw, rules, known_paths, slots, route_path(rules))
    matched = F.col("rule_id").isNotNull()
    threshold_records = _records(
        threshold.withColumn("ts_ms", F.col("proc_ms")).withColumn("reason", F.col("_reason")),
        F.when(matched, F.lit("detection")).otherwise(F.lit("dead")),
        F.lit(""),
        cfg,
    )

    # Velocity and correlation: the other scan, through the stateful operator (which
    # also dead-letters late rows and event-time rows without a usable timestamp).
    keyed = keyed_rows(raw, rules, known_paths, slots, max_ahead_ms=max(1_000, int(watermark_delay_s * 1000)))
    # The job watermark: bounded out-of-orderness over event-time rows. The metadata is
    # then projected away (wm_ts re-derived) so Spark does not drop late rows silently;
    # the processor dead-letters them instead.
    watermarked = keyed.withColumn(
        "wm_ts", F.when(F.col("event_time"), F.timestamp_millis(F.col("ts_ms")))
    ).withWatermark("wm_ts", f"{int(watermark_delay_s * 1000)} milliseconds")
    stateful_in = watermarked.select(
        "rule_id", "k", "role", "rule_ref", "event_time", "ts_ms", "seq", "topic", "raw", "num", "jv", "ts_issue",
        F.pmod(F.xxhash64("k"), F.lit(buckets)).cast("int").alias("bucket"),
    )
    out = stateful_in.groupBy("rule_id", "bucket").transformWithStateInPandas(
        DetectionProcessor(str(cfg.state_dir / RULE_DEFS)), OUTPUT_SCHEMA, "Append", "EventTime"
    )

    members = F.when(
        F.col("rule_type") == "velocity", velocity_members(F.col("agg_type"), F.col("agg_value"))
    ).otherwise(
        correlation_members(
            F.coalesce(F.col("ctx_json"), F.col("ctx_num").cast("string")), F.col("metric"),
            F.col("metric_value"), F.col("ctx_record"), F.col("emit_context"),
        )
    )
    return threshold_records.unionByName(_records(out, F.col("kind"), members, cfg))


# ------------------------------------------------------------------------------ status


class StatusReporter:
    """Writes what a supervisor needs to a status file and the status topic."""

    def __init__(self, cfg: DetectConfig, registry: RuleRegistry, watermark_delay_s: float,
                 topics: list[str] | None = None, quarantine: Quarantine | None = None) -> None:
        self.cfg = cfg
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
            "restart_required": bool(reasons),
            "restart_reasons": reasons,
            "source_topics": self.topics,
            "rule_versions": rules.versions(),
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
            "lag": lag,
            "watermark": (p.get("eventTime") or {}).get("watermark"),
        }

    def count_unreadable(self, progress: dict) -> None:
        """Add one batch's observed skipped rows to the per-rule, per-reason totals."""
        metrics = progress.get("observedMetrics") or {}
        for name in ("skipped_threshold", "skipped_keyed"):
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


def _start_query(spark: SparkSession, cfg: DetectConfig, delay: float, topics: list[str],
                 quarantine: Quarantine) -> StreamingQuery:
    plan = build(spark, cfg, delay, topics, key_buckets(cfg), min_partitions=2 * _cores(spark),
                 quarantined=quarantine.active_ranges())
    return (
        write_stream(plan, cfg.bootstrap, role=ROLE)
        .option("checkpointLocation", str(cfg.checkpoint / "query"))
        .trigger(processingTime=f"{cfg.trigger_ms} milliseconds")
        .queryName("detections")
        .start()
    )


def run(cfg: DetectConfig, stop: threading.Event | None = None) -> int:
    """Run until SIGTERM/SIGINT (or `stop`), then finish the batch in flight and exit 0.

    A failed micro-batch restarts the query in this process: retried once, then its
    records quarantined to the dead-letter topic (quarantine.py); exit 1 only when a
    failure is not a batch's or survives the quarantine.
    """
    from spark_jobs.spark import session

    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    admin.create_topics(cfg.bootstrap, [cfg.sink_topic, cfg.dead_letter_topic, cfg.status_topic, ROUTED_TOPIC,
                                        cfg.rules_topic], role=ROLE)
    dlq = Producer(with_bootstrap(cfg.bootstrap, ROLE))
    registry = RuleRegistry(cfg.bootstrap, cfg.state_dir, cfg.rules_topic, role=ROLE,
                            on_problem=lambda p: report_rule_problem(cfg, dlq, p))
    registry.start()
    delay = job_watermark_delay_s(list(registry.current().rules.values()))
    spark = session("detection-job", master=cfg.master, extra={
        "spark.sql.streaming.stateStore.providerClass": STATE_STORE,
        "spark.sql.streaming.noDataMicroBatches.enabled": "true",
    })
    topics = source_topics(cfg, registry.current().topics())
    quarantine = Quarantine(cfg.checkpoint)
    status = StatusReporter(cfg, registry, delay, topics, quarantine)
    query = _start_query(spark, cfg, delay, topics, quarantine)
    status.query_id, status.run_id, status.state = str(query.id), str(query.runId), "running"
    log.info("detection job started: query %s, watermark delay %ss", query.id, delay)
    status.publish()
    exit_code = 0
    last_batch = None
    try:
        while True:
            while query.isActive and not stop.is_set():
                stop.wait(0.5)
                p = query.lastProgress
                if p is not None and p.get("batchId") != last_batch:
                    last_batch = p.get("batchId")
                    status.progress = p
                    status.count_unreadable(p)
                status.publish()
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
            query = _start_query(spark, cfg, delay, topics, quarantine)
            status.run_id = str(query.runId)
            status.publish()
    finally:
        status.publish()
        status.close()
        registry.stop()
        dlq.flush(5)
    return exit_code
