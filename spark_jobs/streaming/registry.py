"""The live rule set: `rules.active` consumed in the driver, newest record per rule.

Flink broadcast state becomes a snapshot file here: a daemon thread reads the rules
topic (assigned partitions, from the beginning: the topic is compacted and small),
validates every message with the same pydantic model as `rulectl validate`, and
atomically replaces `rules.json` in the job's state directory, then tells the job
(`on_change`), which publishes the new rule set as the next batch's version
(rule_versions.py): a published change applies from the next batch, no restart. The
thread waits for records in a long poll, so a change is read as soon as the broker
has it and a quiet topic costs one fetch per `poll_interval_s`.

An invalid message never replaces a good rule: it is reported (dead-letter topic and
the job log) and the job keeps the rules it had. With a signing key (RULES_SIGNING_KEY_FILE,
spark_jobs/kafka/signing.py) a record that is not signed by the release path is such a
message too: reported and ignored, whatever the broker let through.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import Consumer, Message, TopicPartition
from pydantic import ValidationError

from spark_jobs.kafka import admin
from spark_jobs.kafka.client_config import with_bootstrap
from spark_jobs.rules.model import AnyRule, CorrelationRule, VelocityRule, parse_rule, rule_to_json_dict
from spark_jobs.rules.version_order import compare_versions

log = logging.getLogger(__name__)

# The in-plan label (`in_topic`) of velocity emits bound for correlation rules: no Kafka
# topic; they never leave the job (job.py `_chain`).
ROUTED_TOPIC = "detect.routed"


@dataclass
class RuleProblem:
    offset: int
    key: str | None
    raw: str
    reason: str


@dataclass
class RuleSet:
    """Rules in force, by live id (the rule id; `<rule_id>@shadow` for a shadow
    version), disabled rules removed."""

    rules: dict[str, AnyRule] = field(default_factory=dict)

    def versions(self) -> dict[str, str]:
        return {rid: r.version for rid, r in sorted(self.rules.items())}

    def topics(self) -> list[str]:
        """Topics the job must consume: sources and contexts of the rules in force."""
        out: set[str] = set()
        for r in self.rules.values():
            # A correlation rule fed by a velocity rule reads that rule's emits inside the
            # job (their topic is the velocity rule's, subscribed for it).
            if not (isinstance(r, CorrelationRule) and r.velocity_filter_rule_id):
                out.add(r.source_topic)
            if isinstance(r, CorrelationRule):
                out.add(r.context_topic)
        return sorted(out)


# A problem report carries the offending record, cut to this many characters so that the
# report always fits the dead-letter topic (1 MB per record by default).
MAX_REPORTED_RAW = 16_384


def _problem(offset: int, key: str | None, raw: str, reason: str) -> RuleProblem:
    if len(raw) > MAX_REPORTED_RAW:
        reason = f"{reason} (record of {len(raw)} characters, cut to {MAX_REPORTED_RAW} here)"
        raw = raw[:MAX_REPORTED_RAW]
    return RuleProblem(offset, key[:200] if key else key, raw, reason)


def apply_record(rules: dict[str, AnyRule], key: str | None, value: bytes | None, offset: int,
                 seen: dict[str, tuple[str, str]] | None = None) -> RuleProblem | None:
    """Fold one rules-topic record into `rules`; returns a problem instead of raising.

    `seen` holds the newest (version, canonical body) per rule id, disabled ones
    included, so versions only move forward (`version_order`): a lower version, or the
    same version with another body, is a problem and changes nothing. Any error at all
    while reading the record is a problem, never an exception: one bad record must not
    stop the registry from reading the ones after it.
    """
    seen = {} if seen is None else seen
    if value is None:
        # A tombstone (compaction delete) removes the rule and its version history.
        if key:
            rules.pop(key, None)
            seen.pop(key, None)
        return None
    raw = value.decode("utf-8", errors="replace")
    try:
        data = json.loads(value.decode("utf-8"))
        rule = parse_rule(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return _problem(offset, key, raw, f"invalid rule: not JSON ({exc})")
    except ValidationError as exc:
        first = exc.errors(include_url=False)[:3]
        detail = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {str(e['msg'])[:300]}" for e in first)
        return _problem(offset, key, raw, f"invalid rule: {detail}")
    except (RecursionError, ValueError, TypeError, OverflowError, MemoryError) as exc:
        return _problem(offset, key, raw, f"invalid rule: cannot read it ({type(exc).__name__}: {str(exc)[:300]})")
    if key and key != rule.live_id:
        # The key of a rule is its id; of a shadow version, `<rule_id>@shadow`.
        return _problem(offset, key, raw, f"invalid rule: record key {key!r} != {rule.live_id!r} "
                                          f"(rule_id {rule.rule_id!r}, mode {rule.mode})")
    body = json.dumps(rule_to_json_dict(rule), sort_keys=True)
    live_id = rule.live_id  # a shadow's versions move on their own, beside the active ones
    before = seen.get(live_id)
    if before is not None:
        order = compare_versions(rule.version, before[0])
        if order < 0:
            return _problem(offset, key, raw, f"rule version not newer: {rule.rule_id!r} version {rule.version!r} "
                                              f"is lower than version {before[0]!r} already applied")
        if order == 0:
            if body == before[1]:
                return None  # the same record again (a re-publish): nothing to do
            return _problem(offset, key, raw, f"rule version not newer: {rule.rule_id!r} version {rule.version!r} "
                                              "was already applied with another body; bump the version")
    seen[live_id] = (rule.version, body)
    if rule.enabled:
        rules[live_id] = rule
    else:
        rules.pop(live_id, None)
    return None


def check_references(rules: dict[str, AnyRule]) -> dict[str, AnyRule]:
    """Drop correlation rules whose velocity filter is gone (they receive no primaries)."""
    out = dict(rules)
    for rid, r in rules.items():
        if isinstance(r, CorrelationRule) and r.velocity_filter_rule_id:
            target = rules.get(r.velocity_filter_rule_id)
            if not isinstance(target, VelocityRule) or target.emit_to_sink:
                out.pop(rid)
    return out


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class RuleRegistry:
    """Follows `rules.active` and keeps `rules.json` current."""

    def __init__(
        self,
        bootstrap: str,
        state_dir: Path,
        topic: str = "rules.active",
        on_problem: Callable[[RuleProblem], None] | None = None,
        poll_interval_s: float = 0.5,
        on_change: Callable[[], None] | None = None,
        signing_key: bytes | None = None,
        role: str | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.state_dir = state_dir
        self.rules_file = state_dir / "rules.json"
        self.on_problem = on_problem
        self.on_change = on_change
        self.poll_interval_s = poll_interval_s
        self._rules: dict[str, AnyRule] = {}
        self._seen: dict[str, tuple[str, str]] = {}
        self._offsets: dict[int, int] = {}
        # The principal its consumers act as (the job's: `detector`), None: the process's.
        self.role = role
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._consumer: Consumer | None = None
        self._probe: Consumer | None = None
        # Explicit key, else the environment's (the job is started with it); None: no check.
        from spark_jobs.kafka import signing

        self.signing_key = signing_key if signing_key is not None else signing.key_from_env()
        self.problems: list[RuleProblem] = []
        self.problem_count = 0
        state_dir.mkdir(parents=True, exist_ok=True)

    # -- reading ---------------------------------------------------------------------
    def _ensure_consumer(self) -> Consumer:
        if self._consumer is None:
            admin.create_topics(self.bootstrap, [self.topic], role=self.role)
            self._consumer = Consumer(with_bootstrap(self.bootstrap, self.role, {
                "group.id": f"rules-registry-{os.getpid()}",
                "enable.auto.commit": False,
                "enable.partition.eof": False,
            }))
            parts = admin.topic_partitions(self.bootstrap, self.topic, role=self.role)
            self._offsets = {p: 0 for p in parts}
            self._consumer.assign([TopicPartition(self.topic, p, 0) for p in parts])
        return self._consumer

    def refresh(self, timeout_s: float = 10.0, first: Message | None = None) -> bool:
        """Read every record up to the current end of the topic (`first`: one the caller
        has polled already); True if rules changed."""
        consumer = self._ensure_consumer()
        if self._probe is None:
            self._probe = admin.probe_consumer(self.bootstrap, role=self.role)
        ends = admin.end_offsets(self._probe, [(self.topic, p) for p in self._offsets])
        target = {p: hi for (_t, p), (_lo, hi) in ends.items()}

        def behind() -> bool:
            return any(self._offsets[p] < target.get(p, 0) for p in self._offsets)

        if first is None and not behind():
            if not self.rules_file.exists():
                self._write()
            return False
        # The snapshot is compared once per read, not per record: it renders every rule,
        # so per record a publish of 1,000 rules cost a million renderings (40 s).
        with self._lock:
            before = self._snapshot_text()
        if first is not None:
            self._take(first)
        deadline = time.monotonic() + timeout_s
        while behind():
            if time.monotonic() > deadline:
                log.warning("rules registry: timed out reading %s", self.topic)
                break
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            self._take(msg)
        with self._lock:
            after = self._snapshot_text()
        if after != before or not self.rules_file.exists():
            write_atomic(self.rules_file, after)
        return after != before

    def _take(self, msg: Message) -> None:
        """Apply one record of the topic, or report why it is not applied."""
        key = msg.key().decode("utf-8", errors="replace") if msg.key() is not None else None
        try:
            problem = self._unsigned(msg, key)
            if problem is None:
                with self._lock:
                    problem = apply_record(self._rules, key, msg.value(), msg.offset(), self._seen)
        except Exception as exc:  # noqa: BLE001 - whatever it is, the record is skipped
            problem = _problem(msg.offset(), key, "", f"invalid rule: cannot apply it ({exc!r:.300})")
        # The offset moves on whatever happened to the record.
        self._offsets[msg.partition()] = msg.offset() + 1
        if problem is not None:
            self.problems.append(problem)
            del self.problems[:-1000]  # bounded; the count below keeps the total
            self.problem_count += 1
            log.error("%s offset %s: %s", self.topic, problem.offset, problem.reason[:500])
            if self.on_problem:
                try:
                    self.on_problem(problem)
                except Exception:  # reporting is best effort; the registry goes on
                    log.exception("reporting a rule problem failed")

    def _unsigned(self, msg: object, key: str | None) -> RuleProblem | None:
        """A problem for a record the release path did not sign (when a key is set)."""
        if self.signing_key is None:
            return None
        from spark_jobs.kafka import signing

        reason = signing.verify(self.signing_key, msg.key(), msg.value(), msg.headers())  # type: ignore[attr-defined]
        if reason is None:
            return None
        raw = (msg.value() or b"").decode("utf-8", errors="replace")  # type: ignore[attr-defined]
        return _problem(msg.offset(), key, raw, reason)  # type: ignore[attr-defined]

    def _snapshot_text(self) -> str:
        rules = check_references(self._rules)
        return json.dumps({rid: rule_to_json_dict(r) for rid, r in sorted(rules.items())}, sort_keys=True)

    def _write(self) -> None:
        with self._lock:
            snapshot = self._snapshot_text()
        write_atomic(self.rules_file, snapshot)

    def current(self) -> RuleSet:
        with self._lock:
            return RuleSet(check_references(self._rules))

    # -- background following ----------------------------------------------------------
    def start(self) -> None:
        self.refresh()
        self._thread = threading.Thread(target=self._run, name="rules-registry", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                # A long poll: it returns with the first record the broker has, which
                # the read to the topic's end then joins with the rest of its release.
                msg = self._ensure_consumer().poll(self.poll_interval_s)
                if msg is None or msg.error():
                    continue
                if self.refresh(timeout_s=5.0, first=msg) and self.on_change:
                    self.on_change()
            except Exception:  # keep following; a broker hiccup must not kill the job
                log.exception("rules registry refresh failed")
                self._stop.wait(self.poll_interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        for c in (self._consumer, self._probe):
            if c is not None:
                c.close()
        self._consumer = self._probe = None

