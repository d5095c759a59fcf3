"""What a shadow version would change: its detections against the version in force's.

A shadow version (rule `mode: shadow`) runs in the live job beside the version in force
on the same events; its detections go to the shadow topic, the in-force version's to
the sink. Two detections are of the same event when the event inside them is the same
text (the detection record is the event's text with the rule's members after it),
whatever the versions. Over the hours since the shadow's record was
published on `rules.active`, each event one of them detected is counted, in the hour of
its first detection, as detected by both, only by the shadow or only by the version in
force, with a few examples of each.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from spark_jobs.kafka.admin import KafkaRecord
from spark_jobs.lifecycle.evidence import event_text
from spark_jobs.rules.model import SHADOW_SUFFIX, base_id, shadow_id

KINDS = ("both", "only_shadow", "only_current")
EXAMPLES = 3


@dataclass
class Hour:
    hour: str
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    examples: dict[str, list[str]] = field(default_factory=lambda: {k: [] for k in KINDS})


@dataclass
class ShadowDiff:
    rule_id: str
    shadow_version: str | None
    current_version: str | None
    since: str | None
    hours: list[Hour]

    @property
    def totals(self) -> dict[str, int]:
        return {k: sum(h.counts[k] for h in self.hours) for k in KINDS}

    def to_dict(self) -> dict:
        return {"rule_id": self.rule_id, "shadow_version": self.shadow_version, "current_version": self.current_version,
                "since": self.since, "totals": self.totals,
                "hours": [{"hour": h.hour, "counts": h.counts, "examples": h.examples} for h in self.hours]}


def shadow_record(rules_records: Iterable[KafkaRecord], rule_id: str) -> tuple[dict | None, int | None, dict | None]:
    """(the shadow's rule document, its record's broker time, the version in force's
    document) as rules.active holds them now (None where there is none)."""
    shadow, since, current = None, None, None
    for rec in rules_records:
        key = (rec.key or b"").decode(errors="replace")
        if key not in (rule_id, shadow_id(rule_id)):
            continue
        doc = json.loads(rec.value) if rec.value is not None else None
        if key == rule_id:
            current = doc
        else:
            shadow, since = doc, (rec.timestamp_ms if doc is not None else None)
    return shadow, since, current


def running_shadows(rules_records: Iterable[KafkaRecord]) -> list[dict]:
    """The shadow versions rules.active holds now: rule id, shadow version, the version
    in force (None without one), by rule id."""
    newest: dict[str, dict | None] = {}
    for rec in rules_records:
        newest[(rec.key or b"").decode(errors="replace")] = json.loads(rec.value) if rec.value is not None else None
    return [{"rule_id": d.get("rule_id"), "version": d.get("version"),
             "current": (newest.get(base_id(key)) or {}).get("version")}
            for key, d in sorted(newest.items()) if d is not None and key.endswith(SHADOW_SUFFIX)]


def _hour(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:00Z")


def _events(records: Iterable[KafkaRecord], rule_id: str, since_ms: int) -> dict[str, tuple[int, str]]:
    """event identity -> (earliest broker time, event text) of `rule_id`'s detections."""
    out: dict[str, tuple[int, str]] = {}
    for rec in records:
        if rec.value is None or rec.timestamp_ms < since_ms or (rec.key or b"").decode(errors="replace") != rule_id:
            continue
        text = event_text(rec.value, rule_id)
        if not text:
            continue
        ident = hashlib.sha256(text.encode()).hexdigest()
        if ident not in out or rec.timestamp_ms < out[ident][0]:
            out[ident] = (rec.timestamp_ms, text + "}")
    return out


def diff(sink: Iterable[KafkaRecord], shadow_topic: Iterable[KafkaRecord], rules_records: Iterable[KafkaRecord],
         rule_id: str, since_ms: int | None = None) -> ShadowDiff:
    """The shadow's detections against the version in force's, per hour (module docstring)."""
    shadow, published_ms, current = shadow_record(rules_records, rule_id)
    since = since_ms if since_ms is not None else (published_ms or 0)
    mine, theirs = _events(shadow_topic, rule_id, since), _events(sink, rule_id, since)
    hours: dict[str, Hour] = {}
    for ident in sorted(set(mine) | set(theirs), key=lambda i: min(x[0] for x in (mine.get(i), theirs.get(i)) if x)):
        kind = "both" if ident in mine and ident in theirs else ("only_shadow" if ident in mine else "only_current")
        first_ms, text = min(x for x in (mine.get(ident), theirs.get(ident)) if x)
        h = hours.setdefault(_hour(first_ms), Hour(_hour(first_ms)))
        h.counts[kind] += 1
        if len(h.examples[kind]) < EXAMPLES:
            h.examples[kind].append(text)
    return ShadowDiff(rule_id, (shadow or {}).get("version"), (current or {}).get("version"),
                      _hour_iso(since) if since else None, [hours[k] for k in sorted(hours)])


def read_diff(bootstrap: str, rule_id: str, sink_topic: str = "events.processed",
              shadow_topic: str = "events.shadow", rules_topic: str = "rules.active") -> ShadowDiff:
    """`diff` of the three topics as the broker holds them now (read as `reader`)."""
    from spark_jobs.kafka.admin import read_all

    def read(topic: str) -> list[KafkaRecord]:
        return read_all(bootstrap, topic, timeout=60, role="reader")

    return diff(read(sink_topic), read(shadow_topic), read(rules_topic), rule_id)


def _hour_iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
