"""`rulectl backtest`: a rule set over recorded topics, on Spark, with the engine the
live job uses. Writes OUT/detections.jsonl, OUT/summary.json, OUT/dead_letter.jsonl."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import reduce
from pathlib import Path

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.backtest.inputs import InputSpec, read_input
from spark_jobs.engine.events import classify, split, with_reasons
from spark_jobs.engine.pipeline import active_rules, evaluate
from spark_jobs.engine.values import extract_fields
from spark_jobs.rules.loader import RuleError, load_rules
from spark_jobs.rules.model import AnyRule, CorrelationRule


class BacktestError(RuntimeError):
    def __init__(self, message: str, errors: list[RuleError] | None = None) -> None:
        super().__init__(message)
        self.errors = errors or []


@dataclass(frozen=True)
class HistoryWindow:
    """A window of the event archive (spark_jobs/archive): records whose broker
    timestamp is in [start, end)."""

    table: str
    start: datetime
    end: datetime


@dataclass
class BacktestConfig:
    rules_dir: Path
    inputs: list[InputSpec]
    out_dir: Path
    time_field: str = "timestamp"
    sink_topic: str = "events.processed"
    only: list[str] | None = None
    # Read the archive instead of `inputs` (which must then be empty).
    history: HistoryWindow | None = None


def select_rules(rules: list[AnyRule], only: list[str] | None) -> list[AnyRule]:
    """`--only`: the named rules plus the velocity rules their correlations route from."""
    if not only:
        return rules
    by_id = {r.rule_id: r for r in rules}
    unknown = [r for r in only if r not in by_id]
    if unknown:
        raise BacktestError(f"--only names unknown rule(s): {', '.join(unknown)}")
    keep = set(only)
    for rid in only:
        r = by_id[rid]
        if isinstance(r, CorrelationRule) and r.velocity_filter_rule_id:
            keep.add(r.velocity_filter_rule_id)
    return [r for r in rules if r.rule_id in keep]


def load_rule_set(rules_dir: Path, only: list[str] | None = None) -> list[AnyRule]:
    loaded = load_rules([rules_dir])
    if loaded.errors:
        raise BacktestError(f"{len(loaded.errors)} invalid rule(s) in {rules_dir}", loaded.errors)
    return select_rules([lr.rule for lr in loaded.rules], only)


def _write_jsonl(df: DataFrame, column: str, order: list[str], target: Path) -> None:
    """One sorted JSON Lines file, written by Spark (no collect to the driver)."""
    tmp = target.parent / f".{target.name}.parts"
    shutil.rmtree(tmp, ignore_errors=True)
    df.repartition(1).sortWithinPartitions(*order).select(column).write.mode("overwrite").text(str(tmp))
    parts = sorted(tmp.glob("part-*"))
    with target.open("wb") as out:
        for part in parts:
            with part.open("rb") as src:
                shutil.copyfileobj(src, out)
    shutil.rmtree(tmp, ignore_errors=True)


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# The parsed events are cached, scanned a handful of times and dropped. Building the
# compressed form tries each column's encodings on every value (the event text among
# them), which cost more than it saved: ~4 s of a 100 s run over 1M events. Uncompressed,
# 1M bench events take ~300 MB; past memory they spill to disk (MEMORY_AND_DISK).
_BACKTEST_CONF = {"spark.sql.inMemoryColumnarStorage.compressed": "false"}


@contextmanager
def _session_conf(spark: SparkSession, conf: dict[str, str]) -> Iterator[None]:
    """`conf` for the duration: the session may be the caller's (a notebook, a test)."""
    before = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def run_backtest(spark: SparkSession, cfg: BacktestConfig) -> dict:
    with _session_conf(spark, _BACKTEST_CONF):
        return _run(spark, cfg)


def _run(spark: SparkSession, cfg: BacktestConfig) -> dict:
    started = time.time()
    rules = active_rules(load_rule_set(cfg.rules_dir, cfg.only))
    topics = {s.topic for s in cfg.inputs}
    if len(topics) != len(cfg.inputs):
        raise BacktestError("each topic may be given only once with --input")
    if cfg.history is not None and cfg.inputs:
        raise BacktestError("--history and --input exclude each other")
    cfg.out_dir.mkdir(parents=True, exist_ok=True)

    if cfg.history is not None:
        # The archive holds each record parsed once (v) with its broker timestamp
        # (proc_ms) and arrival order (seq = partition<<40 | offset, as live): only the
        # reasons a record is no event are derived; nothing is parsed again.
        classified, topics = _archive_input(spark, cfg.history, rules)
    else:
        raw = reduce(lambda a, b: a.unionByName(b), [read_input(spark, s, i) for i, s in enumerate(cfg.inputs)])
        classified = classify(raw)
    # Parsed once, every field the rules read extracted once, and kept: every rule, the
    # dead letters and the summary read it. The VARIANT itself is not kept; the
    # extracted columns are all the rules need and are cheaper to scan.
    # A file has no broker timestamp: processing-time rules use the --time-field.
    parsed, fields = extract_fields(classified, rules, [cfg.time_field])
    parsed = (
        parsed.withColumn("proc_ms", F.coalesce("proc_ms", fields.time(cfg.time_field)))
        .drop("v")
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    events, malformed = split(parsed)

    result = evaluate(events, rules, fields)
    # Routed velocity emits feed correlation rules and the summary: compute them once.
    result.routed = {rid: df.persist(StorageLevel.MEMORY_AND_DISK) for rid, df in result.routed.items()}
    dead = reduce(lambda a, b: a.unionByName(b), [malformed, *result.dead_letters])
    dead_json = dead.select(
        "seq", F.to_json(F.struct("topic", "reason", "rule_id", "raw"), {"ignoreNullFields": "false"}).alias("line")
    )
    _write_jsonl(dead_json, "line", ["seq"], cfg.out_dir / "dead_letter.jsonl")

    det_path = cfg.out_dir / "detections.jsonl"
    per_rule: dict[str, dict] = {}
    if result.detections is not None:
        dets = result.detections.persist(StorageLevel.MEMORY_AND_DISK)
        _write_jsonl(dets, "value", ["ts_ms", "rule_id", "seq", "detection_id"], det_path)
        for row in dets.groupBy("rule_id").agg(
            F.count(F.lit(1)).alias("n"), F.min("ts_ms").alias("first"), F.max("ts_ms").alias("last")
        ).collect():
            per_rule[row["rule_id"]] = {"detections": row["n"], "first": row["first"], "last": row["last"]}
        dets.unpersist()
    else:
        det_path.write_text("")

    topic_counts = {r["topic"]: r["n"] for r in events.groupBy("topic").agg(F.count(F.lit(1)).alias("n")).collect()}
    malformed_counts = {
        r["topic"]: r["n"] for r in malformed.groupBy("topic").agg(F.count(F.lit(1)).alias("n")).collect()
    }
    with (cfg.out_dir / "dead_letter.jsonl").open("rb") as fh:
        dead_total = sum(1 for _ in fh)
    routed_counts = {rid: df.count() for rid, df in result.routed.items()}
    primary_counts = {rid: df.count() for rid, df in result.primaries.items()}
    parsed.unpersist()

    summary_rules = {}
    for r in sorted(rules, key=lambda r: r.rule_id):
        stats = per_rule.get(r.rule_id, {"detections": 0, "first": None, "last": None})
        evaluated = primary_counts.get(r.rule_id, topic_counts.get(r.source_topic, 0))
        summary_rules[r.rule_id] = {
            "rule_version": r.version,
            "rule_type": r.rule_type,
            "source_topic": r.source_topic,
            "events_evaluated": evaluated,
            "detections": stats["detections"],
            "routed": routed_counts.get(r.rule_id, 0),
            "first_detection": _iso(stats["first"]),
            "last_detection": _iso(stats["last"]),
        }
    finished = time.time()
    summary = {
        "rules": summary_rules,
        "inputs": {
            topic: {
                "path": path,
                "records": topic_counts.get(topic, 0) + malformed_counts.get(topic, 0),
                "malformed": malformed_counts.get(topic, 0),
            }
            for topic, path in _input_paths(cfg, topics).items()
        },
        "detections": sum(v["detections"] for v in summary_rules.values()),
        "dead_letter": dead_total,
        "sink_topic": cfg.sink_topic,
        "time_field": cfg.time_field,
        **({"history": {"table": cfg.history.table, "from": _iso(int(cfg.history.start.timestamp() * 1000)),
                        "to": _iso(int(cfg.history.end.timestamp() * 1000))}} if cfg.history else {}),
        "started_at": _iso(int(started * 1000)),
        "finished_at": _iso(int(finished * 1000)),
        "duration_s": round(finished - started, 3),
    }
    (cfg.out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _rule_topics(rules: list[AnyRule]) -> list[str]:
    """The topics a rule set reads (source and context topics)."""
    out = {r.source_topic for r in rules}
    out |= {r.context_topic for r in rules if isinstance(r, CorrelationRule)}
    return sorted(out)


def _archive_input(spark: SparkSession, history: HistoryWindow, rules: list[AnyRule]) -> tuple[DataFrame, set[str]]:
    """The archive's window as classified engine input, and the topics it covers: only
    the topics the rules read (pruned by the topic partition, then date, then time)."""
    from spark_jobs.archive.table import engine_input, exists, read_window

    if not exists(spark, history.table):
        raise BacktestError(f"--history {history.table}: not a Delta table (is `rulectl archive` running?)")
    topics = _rule_topics(rules)
    window = read_window(spark, history.table, history.start, history.end, topics)
    return with_reasons(engine_input(window)), set(topics)


def _input_paths(cfg: BacktestConfig, topics: set[str]) -> dict[str, str]:
    if cfg.history is not None:
        return {t: f"{cfg.history.table}#topic={t}" for t in sorted(topics)}
    return {s.topic: s.path for s in cfg.inputs}
