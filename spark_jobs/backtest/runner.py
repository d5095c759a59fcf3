"""`rulectl backtest`: a rule set over recorded topics, on Spark, with the engine the
live job uses. Writes OUT/detections.jsonl, OUT/summary.json, OUT/dead_letter.jsonl."""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

from pyspark import InheritableThread
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.backtest.inputs import InputSpec, read_inputs
from spark_jobs.backtest.kept import LEVEL as KEEP_LEVEL
from spark_jobs.backtest.kept import kept
from spark_jobs.engine.events import classify, split, with_reasons
from spark_jobs.engine.frames import union_all
from spark_jobs.engine.pipeline import EngineResult, active_rules, evaluate, judged
from spark_jobs.engine.values import field, timestamp_ms
from spark_jobs.rules.loader import RuleError, load_rules
from spark_jobs.rules.model import AnyRule, CorrelationRule
from spark_jobs.spark import session_conf, shuffle_partitions

_T = TypeVar("_T")


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


# The two JSON Lines files, sorted through the same key columns: detections by (ts_ms,
# rule_id, seq, detection_id), dead letters by arrival (seq, then rule_id).
_FILES = {"detections": "detections.jsonl", "dead_letter": "dead_letter.jsonl"}
_SORT_KEYS = ["file", "k_time", "rule_id", "k_seq", "k_id"]


def _dead_line() -> Column:
    return F.to_json(F.struct("topic", "reason", "rule_id", "raw"), {"ignoreNullFields": "false"})


def _output_lines(evaluated: DataFrame | None, dead: DataFrame) -> DataFrame:
    """Every line the backtest writes, of both files, as one DataFrame: one Spark job
    writes them (a plan per file was a second planning of the rules and a second pass
    over the kept events, ~1 s of a 200k-event run), and the summary counts them.

    `evaluated` (EngineResult.evaluated) gives detection lines, and dead-letter lines
    where its `reason` is set, in one projection."""
    none_long, none_str = F.lit(None).cast("long"), F.lit(None).cast("string")
    dead_lines = dead.select(
        F.lit("dead_letter").alias("file"), _dead_line().alias("line"),
        F.col("seq").alias("k_time"), F.col("rule_id"), none_long.alias("k_seq"), none_str.alias("k_id"),
    )
    if evaluated is None:
        return dead_lines
    ok = F.col("reason").isNull()
    det_lines = evaluated.select(
        F.when(ok, F.lit("detections")).otherwise(F.lit("dead_letter")).alias("file"),
        F.when(ok, F.col("value")).otherwise(_dead_line()).alias("line"),
        F.when(ok, F.col("ts_ms")).otherwise(F.col("seq")).alias("k_time"), "rule_id",
        F.when(ok, F.col("seq")).alias("k_seq"), F.when(ok, F.col("detection_id")).alias("k_id"),
    )
    return det_lines.unionByName(dead_lines)


def _counts(parsed: DataFrame, lines: DataFrame, result: EngineResult) -> DataFrame:
    """Every count the summary gives, as rows (what, name, n, first, last).

    what: `events`/`malformed` per topic, `detections` per rule (with its first and last
    detection time), `dead_letter` in all, `routed` and `primaries` per rule."""
    none = F.lit(None).cast("long")
    parts = [
        parsed.groupBy("topic", F.when(F.col("_reason").isNull(), "events").otherwise("malformed").alias("what"))
        .agg(F.count(F.lit(1)).alias("n"))
        .select("what", F.col("topic").alias("name"), "n", none.alias("first"), none.alias("last")),
        lines.groupBy(F.col("file").alias("what"), F.when(F.col("file") == "detections", F.col("rule_id")).alias("name"))
        .agg(F.count(F.lit(1)).alias("n"), F.min("k_time").alias("first"), F.max("k_time").alias("last")),
    ]
    for what, df in (("routed", result.routed), ("primaries", result.primaries)):
        if df is not None:
            parts.append(df.groupBy(F.lit(what).alias("what"), F.col("rule_id").alias("name"))
                         .agg(F.count(F.lit(1)).alias("n")).select("what", "name", "n", none.alias("first"),
                                                                    none.alias("last")))
    return union_all(parts)


_COUNTS_PART = "counts"


def _write_and_count(parsed: DataFrame, lines: DataFrame, result: EngineResult, out_dir: Path) -> dict[tuple[str, str], dict]:
    """Both files, each sorted, and the summary's counts (no collect of the lines to the
    driver); returns the counts: (what, name) -> row.

    The lines are cached (at the kept events' level, `kept.LEVEL`), then written by
    two Spark jobs at once:

    - the detections, read from the cache as one partition (a sort is one task whatever
      it reads, so the lines are not exchanged), sorted by (time, rule, arrival, id) and
      written as plain text. The time, a LONG, comes first, so Spark's sort compares
      8-byte prefixes that tell almost every pair apart. A file column first (to write
      both files from one job, partitioned by file) gave every detection the same
      prefix, "detectio": each comparison went to the whole record, and sorting 1.2M
      lines took 0.9 s of the run's last task instead of 0.36 s;
    - the dead letters, sorted by (file, keys), and the counts, written as partitions of
      one text write, on the other core while the detections' task runs (the counts
      used to run before it, with that core idle during the sort and write).

    Measured warm, this beat writing everything in one job behind the counts: the
    second core no longer idles while the detections are sorted and written
    (bench_backtest.py, docs/benchmarks.md).

    The counts aggregate the cached lines (read as two partitions: an aggregate of
    three short columns) and are written as a partition of the second job's output,
    read back here: a count query of its own after the write (planned over the whole
    rule plan again) left the cores idle ~0.6 s longer per warm 200k-event run. Not
    cached, the lines would be computed twice: the count's exchange prunes the columns
    it does not read, so Spark cannot reuse the write's exchange for it."""
    spark = lines.sparkSession
    tmp = out_dir / ".lines.parts"
    shutil.rmtree(tmp, ignore_errors=True)
    # Every rule group's branch gives the lines' union partitions of its own (hundreds for
    # a rule set over many topics), and each partition's task deserializes the whole
    # union's plan before it reads a row: coalesced (partitions merged, no shuffle) to as
    # many as the session runs at once, the plan is deserialized that many times.
    lines = lines.coalesce(max(2, shuffle_partitions(spark))).persist(KEEP_LEVEL)
    no_key = [F.lit(None).cast(t).alias(c) for c, t in (("k_time", "long"), ("rule_id", "string"),
                                                        ("k_seq", "long"), ("k_id", "string"))]
    counts = _counts(parsed, lines.coalesce(2), result).select(
        F.lit(_COUNTS_PART).alias("file"), F.to_json(F.struct("what", "name", "n", "first", "last")).alias("line"),
        *no_key)
    detections = (lines.filter(F.col("file") == "detections").coalesce(1)
                  .sortWithinPartitions(*_SORT_KEYS[1:]).select("line"))
    others = lines.filter(F.col("file") != "detections").coalesce(1).unionByName(counts)
    _alongside(
        spark,
        lambda: detections.write.mode("overwrite").text(str(tmp / "detections")),
        lambda: (others.sortWithinPartitions(*_SORT_KEYS).select("file", "line")
                 .write.partitionBy("file").mode("overwrite").text(str(tmp / "others"))),
    )
    for kind, name in _FILES.items():
        written = tmp / "detections" if kind == "detections" else tmp / "others" / f"file={kind}"
        parts = sorted(written.glob("part-*"))
        if len(parts) == 1:
            parts[0].replace(out_dir / name)  # the one part is the whole file: moved, not copied
            continue
        with (out_dir / name).open("wb") as out:
            for part in parts:
                with part.open("rb") as src:
                    shutil.copyfileobj(src, out)
    rows = [json.loads(line) for part in sorted((tmp / "others" / f"file={_COUNTS_PART}").glob("part-*"))
            for line in part.read_text().splitlines() if line]
    shutil.rmtree(tmp, ignore_errors=True)
    lines.unpersist()
    return {(r["what"], r.get("name") or ""): r for r in rows}


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# The run's caches (the output lines, the routed events, and the parsed events on a
# cluster or Spark Connect: spark_jobs/backtest/kept.py) are scanned a handful of times
# and dropped. Building the compressed form tries each column's encodings on every
# value (the event text among them), which cost more than it saved: ~4 s of a 100 s run
# over 1M events. Uncompressed, 1M bench events take ~300 MB; past memory they spill to
# disk (kept.LEVEL).
_BACKTEST_CONF = {"spark.sql.inMemoryColumnarStorage.compressed": "false"}


def _alongside(spark: SparkSession, background: Callable[[], object], work: Callable[[], _T]) -> _T:
    """`work` on this thread while `background` runs on a PySpark thread (whose JVM
    thread inherits this one's local properties: job group, scheduler pool); returns
    what `work` returns once both are done. An error of `work` is the one raised: the
    background's, only when `work` succeeded."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            background()
        except BaseException as exc:  # noqa: BLE001 - handed to the joining thread
            failed.append(exc)

    thread = InheritableThread(run, session=spark, name="backtest-background", daemon=True)
    thread.start()
    try:
        out = work()
    finally:
        thread.join()
    if failed:
        raise failed[0]
    return out


def _evaluate_and_write(spark: SparkSession, parsed: DataFrame, rules: list[AnyRule],
                        out_dir: Path) -> tuple[dict[tuple[str, str], dict], EngineResult]:
    """The rules over the kept events (spark_jobs.backtest.kept), both files written;
    the counts (see _write_and_count) and the engine's result."""
    # The events are read, parsed and kept on the executors while this thread plans the
    # rules: planning a 62-rule set takes ~0.5 s of driver time on a warm session (Py4J
    # round trips and Spark's analysis of each step), and until the write the cores sat
    # idle for it.
    def plan() -> tuple[EngineResult, DataFrame]:
        events, malformed = split(parsed)
        return evaluate(events, rules), malformed

    result, malformed = _alongside(spark, parsed.count, plan)
    # Routed velocity emits feed correlation rules and the summary: compute them once.
    if result.routed is not None:
        result.routed = result.routed.persist(KEEP_LEVEL)
    dead = union_all([malformed, *result.dead_letters])
    try:
        return _write_and_count(parsed, _output_lines(result.evaluated, dead), result, out_dir), result
    finally:
        if result.routed is not None:
            result.routed.unpersist()


def run_backtest(spark: SparkSession, cfg: BacktestConfig) -> dict:
    with session_conf(spark, _BACKTEST_CONF):
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
        classified = classify(read_inputs(spark, cfg.inputs))
    # Parsed once, judged once by the live job's evaluator (threshold matches and keyed
    # rows), and kept: every rule, the dead letters and the summary read it. The VARIANT
    # itself is not kept; the verdicts are all the rules need.
    # A file has no broker timestamp: processing-time rules use the --time-field.
    classified = classified.withColumn(
        "proc_ms", F.coalesce("proc_ms", timestamp_ms(field(F.col("v"), cfg.time_field))))
    parsed = judged(classified, rules).drop("v")
    with kept(parsed) as parsed:
        counts, result = _evaluate_and_write(spark, parsed, rules, cfg.out_dir)

    def n(what: str, name: str = "") -> int:
        row = counts.get((what, name))
        return row["n"] if row is not None else 0

    summary_rules = {}
    for r in sorted(rules, key=lambda r: r.rule_id):
        stats = counts.get(("detections", r.rule_id))
        summary_rules[r.rule_id] = {
            "rule_version": r.version,
            "rule_type": r.rule_type,
            "source_topic": r.source_topic,
            "events_evaluated": n("primaries", r.rule_id) if isinstance(r, CorrelationRule) else n("events", r.source_topic),
            "detections": n("detections", r.rule_id),
            "routed": n("routed", r.rule_id),
            "first_detection": _iso(stats.get("first") if stats else None),
            "last_detection": _iso(stats.get("last") if stats else None),
        }
    finished = time.time()
    summary = {
        "rules": summary_rules,
        "inputs": {
            topic: {
                "path": path,
                "records": n("events", topic) + n("malformed", topic),
                "malformed": n("malformed", topic),
            }
            for topic, path in _input_paths(cfg, topics).items()
        },
        "detections": sum(v["detections"] for v in summary_rules.values()),
        "dead_letter": n("dead_letter"),
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
