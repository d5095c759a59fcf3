"""Warm windows: a keyed rule whose state starts afresh in the running job first fills
it from the event archive, so it judges its first events as a rule that had run all
along would (docs/rule-language.md, "Warm start").

A velocity rule (or a correlation rule's context) starts afresh when it is new to the
job, when its state signature changed, or when its window changed (the state kept for
the old window holds too little, or too much). With `warm_start` (the default) it comes
into the rule set *warming*:

1. From the first micro-batch that takes it (batch N, recorded by rule_versions.py), its
   rule rows enter its state, but it emits nothing (ruleplatform.keyed.RuleSpec.warming).
2. The events before N (below N's start offsets, from the checkpoint's offset log), as
   far back as the window reaches, are read from the archive (Delta) and, past the
   archive's last offset, from Kafka (Spark's connector, batch), and written to the
   warm-up topic, each naming the rule and its state digest.
3. The keyed query subscribes that topic in every plan: a warm-up record enters only the
   rule it names, and only as state (ruleplatform.rules.KeyedRules.WARM: never late,
   never judged, no dead letter: it had all that when it was live).
4. Once a batch that read every record of the warm-up has committed, the next rule-set
   version has the rule without `warming`: from then on its windows hold every event
   before each one it judges, exactly what a backtest over the archive holds.

Each event reaches the state once: the warm-up below N's offsets, the live rows from N.
A warm-up with the rule's state already partly filled (the job stopped in the middle)
starts again under a new epoch, which is part of the state signature: the partial state
is dropped. When neither the archive nor Kafka reaches a full window back, the rule
emits once the warm-up is in, and its status says `warming` with the time from which
its windows are whole (`until`).

State of the warm-ups: CHECKPOINT/rules/warm.json, live rule id -> entry.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from confluent_kafka import TopicPartition
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from spark_jobs.archive.table import seq_column
from spark_jobs.engine.rule_set import WarmState, signature
from spark_jobs.kafka import admin
from spark_jobs.kafka.spark_io import read_batch, write_batch
from spark_jobs.rules.model import SHADOW_SUFFIX, AnyRule, CorrelationRule, VelocityRule, base_id, parse_rule
from spark_jobs.streaming.rule_versions import batch_versions
from spark_jobs.streaming.rules_source import RuleRow

log = logging.getLogger(__name__)

# ruleplatform.rules.KeyedRules.WARM: a warm-up record's route_from starts with it.
WARM_MARK = "\u0002"
# A warm-up record's value is a JSON object: the rule's live id `r`, its state digest
# `s`, the archived event's topic `t`, arrival position `q`, broker time `p` (ms) and
# text `raw`.

LOADING, WARM, WARMING, COLD, SHARED = "loading", "warm", "warming", "cold", "shared"


def state_digest(sig: str) -> str:
    """ruleplatform.rules.KeyedRules.stateDigest: the first 16 bytes of the signature's
    SHA-256, base64url without padding (what the keyed state stores)."""
    return base64.urlsafe_b64encode(hashlib.sha256(sig.encode()).digest()[:16]).rstrip(b"=").decode()


@dataclass
class Entry:
    """One rule's warm-up: `base` (its signature's digest without the epoch) and
    `window_ms` say when its state starts afresh; `epoch` is folded into the signature
    the job runs; `hashes`: the rule-set versions published while it loads (the first
    batch that takes one is N)."""

    base: str
    window_ms: int
    epoch: int = 0
    state: str = LOADING
    since: str = ""
    hashes: list[str] = field(default_factory=list)
    batch: int | None = None
    events: int | None = None
    warm_end: dict[str, int] | None = None
    until: str | None = None
    reason: str | None = None


def _iso(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _warm_topics(rule: AnyRule) -> list[str]:
    """What a warm-up reads: a velocity rule's events, a correlation rule's context."""
    return [rule.context_topic] if isinstance(rule, CorrelationRule) else [rule.source_topic]


def _delay_ms(rule: AnyRule) -> int:
    return int((rule.watermark_delay_s or 0) * 1000)


class WarmWindows:
    """The job's warm-ups: which rules warm, the warm-up of each (one at a time, on a
    thread of the driver), and when each is in."""

    def __init__(self, spark: SparkSession, *, checkpoint: Path, versions_dir: Path, bootstrap: str, topic: str,
                 archive: str | None, role: str, max_ahead_ms: int, starting_offsets: str = "earliest") -> None:
        self.spark = spark
        self.path = checkpoint / "rules" / "warm.json"
        self.offsets_dir = checkpoint / "query" / "offsets"
        self.versions_dir = versions_dir
        self.bootstrap = bootstrap
        self.topic = topic
        self.archive = archive
        self.role = role
        self.max_ahead_ms = max_ahead_ms
        self.entries: dict[str, Entry] = {}
        planned = self.offsets_dir.is_dir() and any(p.name.isdigit() for p in self.offsets_dir.iterdir())
        # The rules of the first plan need no warm-up when the query is new and reads its
        # topics from the start (it judges all Kafka holds), or when the checkpoint ran
        # before warm-ups were kept (their state is in it).
        self._first: tuple[str, str] | None = None
        if not planned and starting_offsets == "earliest":
            self._first = (WARM, "a new query: it reads its topics from the start")
        elif planned and not self.path.exists():
            self._first = (WARM, "state kept from before warm starts")
        if self.path.exists():
            self.entries = {k: Entry(**v) for k, v in json.loads(self.path.read_text()).items()}
            for e in self.entries.values():
                if e.state == LOADING:
                    # Stopped in the middle: the state holds part of it. Again, afresh.
                    e.epoch += 1
                    e.hashes, e.batch, e.events, e.warm_end = [], None, None, None
        self._rules: dict[str, AnyRule] = {}
        self._running: threading.Thread | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ which rules warm

    def plan(self, rows: Sequence[RuleRow]) -> dict[str, WarmState]:
        """The warm-up state of each keyed rule of `rows` (the rule set to publish): a
        rule whose state starts afresh begins loading (or cold, without `warm_start`, or
        fed by a velocity rule: the second operator's state is filled by live emits)."""
        fed = {r.rule_id for r in rows if r.route_from is not None}
        rules: dict[str, AnyRule] = {}
        for r in rows:
            if r.rule_type != "threshold" and r.rule_id not in rules:
                rules[r.rule_id] = parse_rule(json.loads(r.rule_json))
        with self._lock:
            for live_id in set(self.entries) - set(rules):
                del self.entries[live_id]
            # Versions in force first: a shadow that shares the state of one takes its epoch.
            for live_id, rule in sorted(rules.items(), key=lambda kv: kv[0].endswith(SHADOW_SUFFIX)):
                base, window = state_digest(signature(rule)), rule.window_ms
                e = self.entries.get(live_id)
                in_force = self.entries.get(base_id(live_id)) if live_id.endswith(SHADOW_SUFFIX) else None
                if in_force is not None and _shares(rule, rules[base_id(live_id)]):
                    # The operator judges it on the state of the version in force
                    # (DetectionProcessor `sharing`): nothing of its own to fill.
                    if e is None or e.state != SHARED or e.epoch != in_force.epoch:
                        self.entries[live_id] = Entry(base, window, in_force.epoch, SHARED, _iso(time.time() * 1000),
                                                      reason="shares the state of the version in force")
                    continue
                # (A shadow that shared state it no longer does fills its own, afresh.)
                if e is not None and e.state != SHARED and e.base == base and e.window_ms == window:
                    continue
                # A window change keeps the signature: a new epoch drops the old state.
                epoch = e.epoch + 1 if e is not None and e.base == base else 0
                e = Entry(base, window, epoch, since=_iso(time.time() * 1000))
                if self._first is not None:
                    e.state, e.reason = self._first
                elif not getattr(rule, "warm_start", True):
                    e.state, e.reason = COLD, "warm_start: false"
                elif live_id in fed:
                    e.state, e.reason = COLD, "fed by a velocity rule: its state fills with that rule's emits"
                self.entries[live_id] = e
            self._rules = rules
            self._first = None
            self._save()
            return {k: WarmState(e.epoch, e.state == LOADING) for k, e in self.entries.items()}

    def published(self, digest: str) -> None:
        """A rule-set version was published with the current plan: a loading rule's
        first batch is the first to take one of these."""
        with self._lock:
            for e in self.entries.values():
                if e.state == LOADING and digest not in e.hashes:
                    e.hashes.append(digest)
            self._save()

    # ------------------------------------------------------------------ the warm-ups

    def advance(self, progress: Mapping | None) -> bool:
        """One step of each loading rule (called by the job's driver loop): start the
        warm-up of the next rule whose first batch is recorded, and end those whose
        records a committed batch has read. True when a rule came out of loading (the
        rule set is to be published again)."""
        done = False
        with self._lock:
            read = _read_upto(progress, self.topic)
            for live_id, e in self.entries.items():
                if e.state == LOADING and e.warm_end is not None and all(
                        read.get(p, 0) >= end for p, end in e.warm_end.items()):
                    e.state = WARMING if e.until and e.until > _iso(time.time() * 1000) else WARM
                    e.hashes = []
                    log.info("warm-up of %s is in (%s events): it judges from the next batch", live_id, e.events)
                    done = True
            if done:
                self._save()
            if self._running is not None and self._running.is_alive():
                return done
            recorded = None
            for live_id, e in self.entries.items():
                if e.state != LOADING or e.events is not None:
                    continue
                recorded = recorded if recorded is not None else batch_versions(self.versions_dir)
                first = self._first_batch(e, recorded)
                if first is None:
                    continue
                e.batch = first
                rule = self._rules[live_id]
                self._running = threading.Thread(target=self._warm_up, args=(live_id, e, rule), daemon=True,
                                                 name=f"warm-up {live_id}")
                self._running.start()
                break
        return done

    def _warm_up(self, live_id: str, e: Entry, rule: AnyRule) -> None:
        try:
            count, until = self._write(live_id, e, rule)
        except Exception as exc:  # the rule stays loading; the next start tries again
            log.exception("warm-up of %s failed", live_id)
            with self._lock:
                e.reason = f"warm-up failed: {exc}"[:500]
                e.hashes = []
                self._save()
            return
        ends = {str(p): high for p, (_, high) in admin.watermarks(self.bootstrap, self.topic, role=self.role).items()}
        with self._lock:
            e.events, e.until, e.warm_end = count, until, ends
            self._save()
        log.info("warm-up of %s written: %d events before batch %s", live_id, count, e.batch)

    def _first_batch(self, e: Entry, recorded: Mapping[int, str]) -> int | None:
        """The first batch of the query that judges with the rule loading (called after
        its version was published): the first recorded with one of `e.hashes`, or, when
        the last planned batch finished with an older version (or read nothing), the
        next one, which is planned after the publish and so takes it. None: not known yet."""
        first = min((b for b, h in recorded.items() if h in e.hashes), default=None)
        if first is not None:
            return first
        planned = [int(p.name) for p in self.offsets_dir.iterdir() if p.name.isdigit()] \
            if self.offsets_dir.is_dir() else []
        if not planned:
            return None
        last = max(planned)
        done = (self.offsets_dir.parent / "commits" / str(last)).exists()
        return last + 1 if done and recorded.get(last) not in e.hashes else None

    def _cutoff(self, batch: int) -> dict[str, dict[str, int]]:
        """The start offsets of `batch`: the end offsets the checkpoint's offset log
        holds for the batch before it; for the query's first, the offsets its Kafka
        source started from (Spark's `sources/0/0`)."""
        if batch == 0:
            text = (self.offsets_dir.parent / "sources" / "0" / "0").read_text()
            return json.loads(text[text.index("{"):])
        lines = (self.offsets_dir / str(batch - 1)).read_text().splitlines()
        return json.loads(lines[2])

    def _write(self, live_id: str, e: Entry, rule: AnyRule) -> tuple[int, str | None]:
        """The warm-up records of `rule` (events before batch `e.batch` in its window's
        reach) to the warm-up topic; returns how many, and when its windows are whole
        (None: now) when the sources do not reach back a full window."""
        assert e.batch is not None
        topics = _warm_topics(rule)
        now = int(time.time() * 1000)
        lo = now - e.window_ms - _delay_ms(rule) - self.max_ahead_ms
        cutoff = self._cutoff(e.batch)
        ranges = {(t, int(p)): off for t in topics for p, off in (cutoff.get(t) or {}).items()}
        parts: list[DataFrame] = []
        archived: dict[tuple[str, int], int] = {}
        # Per partition, whether a source holds a full window back: a first record at
        # or before `lo`, or the partition's very first record (offset 0).
        covered: set[tuple[str, int]] = set()
        earliest: int | None = None
        if self.archive:
            arch = self._archive(topics)
            if arch is not None:
                for r in arch.groupBy("topic", "partition").agg(
                        F.min("offset").alias("first"), F.min(F.unix_millis("timestamp")).alias("at")).collect():
                    tp = (r["topic"], r["partition"])
                    if r["first"] == 0 or r["at"] <= lo:
                        covered.add(tp)
                    earliest = r["at"] if earliest is None else min(earliest, r["at"])
                in_range = arch.where((F.col("timestamp") >= F.timestamp_millis(F.lit(lo))) & _below(ranges))
                archived = {(r["topic"], r["partition"]): r["last"] for r in
                            in_range.groupBy("topic", "partition").agg(F.max("offset").alias("last")).collect()}
                parts.append(in_range.select("topic", "partition", "offset", "timestamp",
                                             F.col("value").cast("string").alias("raw")))
        starts, kafka_covered = self._kafka_starts(ranges, archived, lo)
        covered |= kafka_covered
        if starts:
            spans = {t: {str(p): s for (tt, p), s in starts.items() if tt == t} for t in topics}
            ends = {t: {str(p): ranges[(tt, p)] for (tt, p) in starts if tt == t} for t in topics}
            kafka = read_batch(self.spark, self.bootstrap, [t for t in topics if spans[t]],
                               starting_offsets=json.dumps({t: s for t, s in spans.items() if s}),
                               ending_offsets=json.dumps({t: s for t, s in ends.items() if s}), role=self.role)
            parts.append(kafka.where(F.col("timestamp") >= F.timestamp_millis(F.lit(lo))).select(
                "topic", "partition", "offset", "timestamp", F.col("value").cast("string").alias("raw")))
        until = None
        if not set(ranges) <= covered:
            start = earliest if earliest is not None else now
            until = _iso(start + e.window_ms + _delay_ms(rule))
        if not parts:
            return 0, until
        rows = parts[0]
        for p in parts[1:]:
            rows = rows.unionByName(p)
        envelope = F.to_json(F.struct(
            F.lit(live_id).alias("r"), F.lit(state_digest(signature(rule, e.epoch))).alias("s"),
            F.col("topic").alias("t"),
            seq_column().alias("q"),
            F.unix_millis("timestamp").alias("p"), F.col("raw")))
        out = rows.select(F.lit(self.topic).alias("topic"), F.lit(live_id).alias("key"), envelope.alias("value"))
        out = out.cache()
        try:
            count = out.count()
            write_batch(out, self.bootstrap, role=self.role)
        finally:
            out.unpersist()
        return count, until

    def _archive(self, topics: list[str]) -> DataFrame | None:
        from spark_jobs.archive.table import exists

        if not exists(self.spark, self.archive or ""):
            return None
        return self.spark.read.format("delta").load(self.archive).where(F.col("topic").isin(topics))

    def _kafka_starts(self, ranges: Mapping[tuple[str, int], int], archived: Mapping[tuple[str, int], int],
                      lo: int) -> tuple[dict[tuple[str, int], int], set[tuple[str, int]]]:
        """Where the Kafka part of a warm-up starts per partition (past the archive's
        last offset and the window's reach; none where that is the cutoff or past it),
        and the partitions of which the broker still holds a full window back."""
        consumer = admin.probe_consumer(self.bootstrap, role=self.role)
        try:
            tps = list(ranges)
            lows = admin.end_offsets(consumer, tps)
            times = consumer.offsets_for_times([TopicPartition(t, p, lo) for t, p in tps], timeout=10) if tps else []
        finally:
            consumer.close()
        starts: dict[tuple[str, int], int] = {}
        covered: set[tuple[str, int]] = set()
        for tp, at in zip(tps, times, strict=True):
            low, high = lows[tp]
            by_time = at.offset if at.offset >= 0 else high
            if low == 0 or by_time > low:
                covered.add(tp)
            start = max(by_time, low, archived.get(tp, -1) + 1)
            if start < ranges[tp]:
                starts[tp] = start
        return starts, covered

    # ------------------------------------------------------------------ status

    def status(self) -> dict[str, dict]:
        """Per keyed rule: `loading` (filling from the archive, no detections yet),
        `warming` (judging; its windows are whole from `until`), `warm`, `cold`."""
        now = _iso(time.time() * 1000)
        with self._lock:
            out = {k: {key: v for key, v in asdict(e).items() if key in (
                "state", "since", "batch", "events", "until", "reason", "epoch")} for k, e in self.entries.items()}
        for live_id, entry in out.items():
            if entry["state"] == WARMING and entry["until"] and entry["until"] <= now:
                entry["state"] = WARM
            elif entry["state"] == SHARED and out.get(base_id(live_id), {}).get("state") == LOADING:
                entry["state"] = LOADING  # judged with the version in force, which is loading
        return out

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        tmp.write_text(json.dumps({k: asdict(e) for k, e in self.entries.items()}, indent=1))
        tmp.replace(self.path)


def _shares(shadow: AnyRule, in_force: AnyRule) -> bool:
    """Whether a shadow is judged on the state of the version in force (the JVM's
    DetectionProcessor `shares`): the same events enter both (the same state signature
    and, for a correlation rule, primaries routed from the same velocity rule, if any)
    and both keep them as long (the same window, or lookback)."""
    if type(shadow) is not type(in_force) or signature(shadow) != signature(in_force):
        return False
    if isinstance(shadow, VelocityRule):
        return shadow.window_ms == in_force.window_ms
    return (isinstance(shadow, CorrelationRule) and isinstance(in_force, CorrelationRule)
            and shadow.lookback_ms == in_force.lookback_ms
            and shadow.velocity_filter_rule_id == in_force.velocity_filter_rule_id)


def _below(ranges: Mapping[tuple[str, int], int]) -> Column:
    """Archive rows before the cutoff: (topic, partition, offset) under its offset."""
    cond = F.lit(False)
    for (t, p), off in ranges.items():
        cond = cond | ((F.col("topic") == t) & (F.col("partition") == p) & (F.col("offset") < off))
    return cond


def _read_upto(progress: Mapping | None, topic: str) -> dict[str, int]:
    """partition -> the offset up to which the query's last committed batch read `topic`."""
    for src in (progress or {}).get("sources", []):
        end = src.get("endOffset")
        if isinstance(end, str):
            end = json.loads(end)
        if isinstance(end, dict) and topic in end:
            return {str(p): int(o) for p, o in end[topic].items()}
    return {}


def unpack(value: Column, is_warm: Column) -> dict[str, Column]:
    """The columns of a warm-up record as the job reads an event (`_input`): the rule it
    is for (route_from, WARM_MARK rule NUL digest), the event's topic, arrival position,
    broker time and text; NULL on other records. Read through VARIANT, as events are
    (from_json would be the one projection of the plan without generated code)."""
    env = F.when(is_warm, F.try_parse_json(value))

    def get(name: str, kind: str) -> Column:
        return F.try_variant_get(env, f"$.{name}", kind)

    return {
        "route_from": F.concat(F.lit(WARM_MARK), get("r", "string"), F.lit("\u0000"), get("s", "string")),
        "topic": get("t", "string"), "seq": get("q", "bigint"), "proc_ms": get("p", "bigint"),
        "raw": get("raw", "string"),
    }
