"""Read backtest outputs and compare two of them (candidate vs published).

Detection ids hash the rule *version* (docs/rule-language.md), so the candidate version of a rule
never shares an id with the published version even when both flag the same event.
Alerts are therefore matched first by detection_id (same version on both sides) and
then by the event they were raised on (the detection minus the members the engine
appends): that is what an approver means by "this alert is new" or "this alert goes
away".
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from spark_jobs.report.timeparse import get_path, to_epoch_ms

# Members the engine appends to the original event (the sink contract:
# docs/rule-language.md, "The detection record").
DETECTION_MEMBERS = frozenset(
    {
        "rule_id",
        "rule_version",
        "rule_type",
        "rule_name",
        "processed",
        "detection_id",
        "aggregation_type",
        "aggregation_value",
        "context_value",
        "metric",
        "metric_value",
        "context",
    }
)
_VALUE_MEMBERS = ("aggregation_value", "metric_value", "context_value")


@dataclass(frozen=True)
class Detection:
    """The parts of one detection the report needs (not the whole record)."""

    detection_id: str
    rule_id: str
    rule_version: str
    event_ms: int | None
    fingerprint: str
    summary: str
    value: object = None


@dataclass
class BacktestOutput:
    """One backtest run: its summary.json and its detections."""

    label: str
    summary: dict = field(default_factory=dict)
    detections: list[Detection] = field(default_factory=list)
    ran: bool = True

    def by_rule(self) -> dict[str, list[Detection]]:
        out: dict[str, list[Detection]] = defaultdict(list)
        for d in self.detections:
            out[d.rule_id].append(d)
        return out

    def rule_summary(self, rule_id: str) -> dict:
        return dict((self.summary.get("rules") or {}).get(rule_id) or {})


def event_fingerprint(record: Mapping) -> str:
    """Stable hash of the original event inside a detection."""
    event = {k: v for k, v in record.items() if k not in DETECTION_MEMBERS}
    text = json.dumps(event, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _summary_text(record: Mapping, limit: int = 160) -> str:
    event = {k: v for k, v in record.items() if k not in DETECTION_MEMBERS}
    text = json.dumps(event, separators=(", ", ": "), default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def detection_time_ms(record: Mapping, time_field: str | None, default_time_field: str) -> int | None:
    """Event time for plots: the rule's timestamp field if present, else the default field."""
    for path in (time_field, default_time_field):
        if path:
            ms = to_epoch_ms(get_path(record, path))
            if ms is not None:
                return ms
    return None


def read_detections(
    path: Path, time_fields: Mapping[str, str | None], default_time_field: str = "timestamp"
) -> list[Detection]:
    """Parse OUT/detections.jsonl; lines that are not JSON objects are skipped."""
    out: list[Detection] = []
    if not path.exists():
        return out
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if not isinstance(rec, dict):
                continue
            rid = str(rec.get("rule_id", ""))
            value = next((rec[k] for k in _VALUE_MEMBERS if k in rec), None)
            out.append(
                Detection(
                    detection_id=str(rec.get("detection_id", "")),
                    rule_id=rid,
                    rule_version=str(rec.get("rule_version", "")),
                    event_ms=detection_time_ms(rec, time_fields.get(rid), default_time_field),
                    fingerprint=event_fingerprint(rec),
                    summary=_summary_text(rec),
                    value=value,
                )
            )
    return out


def load_backtest(
    out_dir: Path | str | None,
    label: str,
    time_fields: Mapping[str, str | None],
    default_time_field: str = "timestamp",
) -> BacktestOutput:
    """Load OUT/summary.json and OUT/detections.jsonl; a missing dir means "not run"."""
    if out_dir is None or not Path(out_dir).exists():
        return BacktestOutput(label=label, ran=False)
    out = Path(out_dir)
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text(encoding="utf-8")) if summary_path.exists() else {}
    return BacktestOutput(
        label=label,
        summary=summary,
        detections=read_detections(out / "detections.jsonl", time_fields, default_time_field),
    )


@dataclass
class RuleDiff:
    """Alerts of one rule on both sides, matched."""

    added: list[Detection]
    removed: list[Detection]
    common: int


def diff_detections(candidate: Iterable[Detection], published: Iterable[Detection]) -> RuleDiff:
    """Match alerts by detection_id, then by event fingerprint (a multiset match)."""
    cand = list(candidate)
    pub = list(published)
    pub_ids: dict[str, int] = defaultdict(int)
    for d in pub:
        pub_ids[d.detection_id] += 1
    cand_rest: list[Detection] = []
    common = 0
    for d in cand:
        if pub_ids.get(d.detection_id, 0) > 0:
            pub_ids[d.detection_id] -= 1
            common += 1
        else:
            cand_rest.append(d)
    pub_rest: list[Detection] = []
    for d in pub:
        if pub_ids.get(d.detection_id, 0) > 0:
            pub_ids[d.detection_id] -= 1
            pub_rest.append(d)
    by_fp: dict[str, list[Detection]] = defaultdict(list)
    for d in pub_rest:
        by_fp[d.fingerprint].append(d)
    added: list[Detection] = []
    for d in cand_rest:
        bucket = by_fp.get(d.fingerprint)
        if bucket:
            bucket.pop()
            common += 1
        else:
            added.append(d)
    removed = [d for bucket in by_fp.values() for d in bucket]
    key = lambda d: (d.event_ms is None, d.event_ms or 0, d.detection_id)  # noqa: E731
    return RuleDiff(added=sorted(added, key=key), removed=sorted(removed, key=key), common=common)


_NICE_BUCKETS_MS = [
    60_000,
    5 * 60_000,
    15 * 60_000,
    30 * 60_000,
    3_600_000,
    3 * 3_600_000,
    6 * 3_600_000,
    12 * 3_600_000,
    86_400_000,
    7 * 86_400_000,
]


def choose_bucket_ms(span_ms: int, target_buckets: int = 48) -> int:
    """A readable bucket width giving at most about `target_buckets` buckets."""
    for b in _NICE_BUCKETS_MS:
        if span_ms / b <= target_buckets:
            return b
    return _NICE_BUCKETS_MS[-1]


def time_series(
    detections: Iterable[Detection], start_ms: int, bucket_ms: int, buckets: int
) -> list[int]:
    """Detections per bucket; detections outside the range or without a time are ignored."""
    counts = [0] * buckets
    for d in detections:
        if d.event_ms is None:
            continue
        i = (d.event_ms - start_ms) // bucket_ms
        if 0 <= i < buckets:
            counts[int(i)] += 1
    return counts
