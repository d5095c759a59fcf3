"""Publish validated rules to `rules.active`, idempotently.

The running detection job keeps the newest record per rule_id of `rules.active`, so the
topic *is* the live rule set. Publishing reads that set first and sends only the rules
whose canonical JSON differs (new rule, new version, enabled flipped): re-running a
release (an Airflow retry, a second click) publishes nothing and wakes nobody, and the
topic stays a short, readable audit trail of real changes.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import NamedTuple

from confluent_kafka import Producer

from spark_jobs.kafka.admin import TopicSpec, create_topics, read_all
from spark_jobs.kafka.client_config import with_bootstrap
from spark_jobs.rules.model import AnyRule, rule_to_json_dict, shadow_id

RULES_TOPIC = "rules.active"
# The release path's principal: the only one allowed to write the rules topic.
ROLE = "publisher"
RULES_TOPIC_SPEC = TopicSpec(partitions=1, config={"cleanup.policy": "compact"})


class RuleRef(NamedTuple):
    rule_id: str
    version: str


@dataclass
class PublishResult:
    """What a publish did: rules sent to the topic and rules already there unchanged."""

    topic: str
    published: list[RuleRef] = field(default_factory=list)
    unchanged: list[RuleRef] = field(default_factory=list)
    # Published with content changed but the same version as the live record: the job
    # swaps a rule on a version change, so these may not take effect (worth a warning).
    same_version: list[RuleRef] = field(default_factory=list)
    # rule_id -> (partition, offset) of each record the broker acknowledged: where the
    # release put the rule, which the audit keeps and `rulectl explain` reads back.
    offsets: dict[str, tuple[int, int]] = field(default_factory=dict)
    # Shadow records (`<rule_id>@shadow`) ended by a tombstone: an active version of
    # their rule was published.
    ended: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.published)

    def to_dict(self) -> dict:
        return {
            "topic": self.topic,
            "published": [r._asdict() for r in self.published],
            "unchanged": [r._asdict() for r in self.unchanged],
            "same_version": [r._asdict() for r in self.same_version],
            "offsets": {rid: {"partition": p, "offset": o} for rid, (p, o) in sorted(self.offsets.items())},
            "ended": list(self.ended),
        }


class PublishError(RuntimeError):
    """A rule could not be delivered to the broker; nothing is reported as published."""


def canonical_json(data: Mapping) -> bytes:
    """Stable bytes for a rule dict (sorted keys, no spaces): same rule, same bytes."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def current_rules(bootstrap: str, topic: str = RULES_TOPIC, timeout: float = 30.0,
                  client: Mapping[str, object] | None = None) -> dict[str, dict]:
    """rule_id -> rule dict of the newest record per key on `topic` ({} if no topic).

    A tombstone (null value) removes its key. A record whose value is not a JSON object
    is kept as `{"_unparseable": <text>}` so it differs from every real rule and the
    next publish overwrites it rather than trusting it.
    """
    newest: dict[str, dict] = {}
    for rec in read_all(bootstrap, topic, timeout=timeout, role=ROLE, extra=client):
        if rec.key is None:
            continue
        key = rec.key.decode("utf-8", errors="replace")
        if rec.value is None:
            newest.pop(key, None)
            continue
        newest[key] = _parse_value(rec.value)
    return newest


def _parse_value(value: bytes) -> dict:
    try:
        data = json.loads(value)
    except (UnicodeDecodeError, ValueError):
        return {"_unparseable": value.decode("utf-8", errors="replace")}
    return data if isinstance(data, dict) else {"_unparseable": value.decode("utf-8", errors="replace")}


def publish_rules(
    rules: Iterable[AnyRule],
    bootstrap: str,
    topic: str = RULES_TOPIC,
    *,
    published_by: str | None = None,
    commit: str | None = None,
    published_at: datetime | None = None,
    timeout: float = 30.0,
    client: Mapping[str, object] | None = None,
) -> PublishResult:
    """Publish the rules whose canonical JSON differs from the topic's newest record.

    Records are keyed by rule_id (UTF-8) with the canonical rule JSON as value, in
    rule_id order, with audit headers (`published_at`, and `published_by` / `commit`
    when given). Every record is acknowledged before this returns; any delivery error
    raises PublishError.

    The clients act as the `publisher` principal, the only one the broker lets write
    the rules topic (spark_jobs/kafka/security.py); `client` overrides their settings
    (an Airflow connection's extra with its own SASL settings).
    """
    ordered = sorted(rules, key=lambda r: r.rule_id)
    _check_unique(ordered)
    create_topics(bootstrap, {topic: RULES_TOPIC_SPEC}, timeout=timeout, role=ROLE, extra=client)
    live = current_rules(bootstrap, topic, timeout=timeout, client=client)
    result = PublishResult(topic=topic)
    to_send: list[tuple[str, str, dict | None]] = []
    for rule in ordered:
        data = rule_to_json_dict(rule)
        ref = RuleRef(rule.live_id, rule.version)
        old = live.get(rule.live_id)
        if old == data:
            result.unchanged.append(ref)
            continue
        to_send.append((rule.live_id, rule.version, data))
        result.published.append(ref)
        if old is not None and old.get("version") == data["version"]:
            result.same_version.append(ref)
        if rule.mode == "active" and shadow_id(rule.rule_id) in live:
            # A version in force ends the rule's shadow (promoted, or replaced): a
            # tombstone of its record, so the job stops running it.
            to_send.append((shadow_id(rule.rule_id), "", None))
            result.ended.append(shadow_id(rule.rule_id))
    if to_send:
        headers = _audit_headers(published_by, commit, published_at)
        result.offsets = _send(bootstrap, topic, to_send, headers, timeout, client)
    return result


def _check_unique(rules: list[AnyRule]) -> None:
    seen: set[str] = set()
    for r in rules:
        if r.rule_id in seen:
            raise ValueError(f"duplicate rule_id {r.rule_id!r} in the rules to publish")
        seen.add(r.rule_id)


def _audit_headers(
    published_by: str | None, commit: str | None, published_at: datetime | None
) -> list[tuple[str, bytes]]:
    when = (published_at or datetime.now(UTC)).astimezone(UTC).isoformat().replace("+00:00", "Z")
    headers = [("published_at", when.encode())]
    if published_by:
        headers.append(("published_by", published_by.encode()))
    if commit:
        headers.append(("commit", commit.encode()))
    return headers


def _send(
    bootstrap: str,
    topic: str,
    items: list[tuple[str, str, dict | None]],
    headers: list[tuple[str, bytes]],
    timeout: float,
    client: Mapping[str, object] | None = None,
) -> dict[str, tuple[int, int]]:
    """Produce every item (record key, version, rule document or None for a tombstone)
    and wait for its acknowledgement; returns record key -> (partition, offset) as the
    broker acknowledged them."""
    errors: list[str] = []
    offsets: dict[str, tuple[int, int]] = {}

    def on_delivery(err: object, msg: object) -> None:
        if err is not None:
            errors.append(f"{msg.key()!r}: {err}")  # type: ignore[attr-defined]
        else:
            offsets[msg.key().decode("utf-8")] = (msg.partition(), msg.offset())  # type: ignore[attr-defined]

    # Idempotent producer: a retried send can neither duplicate nor reorder a rule.
    producer = Producer(
        with_bootstrap(bootstrap, ROLE, {
            **(client or {}),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "message.timeout.ms": int(timeout * 1000),
        })
    )
    from spark_jobs.kafka import signing

    signing_key = signing.key_from_env()
    for live_id, version, data in items:  # data None: a tombstone
        rule_headers = [*headers, ("rule_version", version.encode())] if data is not None else list(headers)
        key, value = live_id.encode("utf-8"), None if data is None else canonical_json(data)
        if signing_key is not None:
            # The job accepts only signed records (spark_jobs/kafka/signing.py).
            rule_headers.append((signing.HEADER, signing.sign(signing_key, key, value).encode()))
        producer.produce(
            topic,
            key=key,
            value=value,
            headers=rule_headers,
            on_delivery=on_delivery,
        )
    remaining = producer.flush(timeout)
    if errors or remaining:
        detail = errors[0] if errors else f"{remaining} record(s) unacknowledged after {timeout}s"
        raise PublishError(f"publishing to {topic!r} failed: {detail}")
    return offsets
