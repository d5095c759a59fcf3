"""Assemble the backtest report (a JSON document) from backtest outputs.

The JSON is the report's source of truth: the HTML is rendered from it, the approval
page summarises it, and scheduled reports read earlier ones for trends. Keeping it a
plain dict (no custom classes) means any tool can read it.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from datetime import UTC, datetime

import yaml

from spark_jobs.report.data import (
    BacktestOutput,
    Detection,
    choose_bucket_ms,
    diff_detections,
    time_series,
)
from spark_jobs.report.timeparse import ms_to_iso, to_epoch_ms

REPORT_VERSION = 1


@dataclass(frozen=True)
class RuleChange:
    """One rule of the release: its candidate form (at the commit) and the live one."""

    rule_id: str
    candidate: dict | None
    published: dict | None

    @property
    def status(self) -> str:
        if self.published is None:
            return "new"
        if self.candidate is None:
            return "removed"
        return "unchanged" if self.candidate == self.published else "changed"


def rule_yaml(rule: dict | None) -> str:
    """Canonical YAML of a rule; unset optional fields (null) are left out of the diff."""
    if rule is None:
        return ""
    # A fixed key order: rule documents that went through JSON stores (Kafka, XCom on
    # PostgreSQL JSONB) come back with their keys reordered, which must not show as a diff.
    head = [k for k in _HEAD_KEYS if rule.get(k) is not None]
    rest = sorted(k for k in rule if k not in _HEAD_KEYS and rule[k] is not None)
    return yaml.safe_dump({k: rule[k] for k in head + rest}, sort_keys=False, allow_unicode=True)


_HEAD_KEYS = ("rule_id", "version", "rule_type", "name", "description", "source_topic", "enabled", "owner", "tags")


def rule_diff_text(change: RuleChange) -> str:
    """Unified diff of the canonical YAML of the live version and the candidate."""
    pv = (change.published or {}).get("version")
    cv = (change.candidate or {}).get("version")
    old = rule_yaml(change.published).splitlines(keepends=True)
    new = rule_yaml(change.candidate).splitlines(keepends=True)
    lines = difflib.unified_diff(
        old,
        new,
        fromfile=f"published/{change.rule_id}" + (f" (version {pv})" if pv else " (not published)"),
        tofile=f"candidate/{change.rule_id}" + (f" (version {cv})" if cv else " (removed)"),
        n=3,
    )
    return "".join(line if line.endswith("\n") else line + "\n" for line in lines)


def _rate(detections: int, events: int | None) -> float | None:
    """Alerts per 1,000 evaluated events (None when nothing was evaluated)."""
    if not events:
        return None
    return round(1000.0 * detections / events, 3)


def _side_stats(bt: BacktestOutput, rule_id: str, dets: list[Detection]) -> dict | None:
    if not bt.ran:
        return None
    s = bt.rule_summary(rule_id)
    if not s and not dets:
        return None
    count = int(s.get("detections", len(dets)))
    events = s.get("events_evaluated")
    return {
        "rule_version": s.get("rule_version"),
        "detections": count,
        "events_evaluated": events,
        "alert_rate_per_1000": _rate(count, events),
        "first_detection": s.get("first_detection"),
        "last_detection": s.get("last_detection"),
    }


def _row(d: Detection) -> dict:
    return {
        "detection_id": d.detection_id,
        "rule_version": d.rule_version,
        "event_time": ms_to_iso(d.event_ms),
        "value": d.value,
        "event": d.summary,
    }


def _series_range(window: dict | None, detections: list[Detection]) -> tuple[int, int]:
    """The plotted time range: where the detections are, within the history window.

    A quiet day with alerts in one hour would be a flat line over 24 h; zooming on the
    detections (padded, at least 10 minutes) keeps the shape readable.
    """
    w_start = to_epoch_ms((window or {}).get("start"))
    w_end = to_epoch_ms((window or {}).get("end"))
    times = [d.event_ms for d in detections if d.event_ms is not None]
    if not times:
        start = w_start if w_start is not None else 0
        end = w_end if w_end is not None else start + 3_600_000
        return start, max(end, start + 60_000)
    lo, hi = min(times), max(times)
    pad = max((hi - lo) // 20, 60_000)
    start, end = lo - pad, hi + pad
    if end - start < 600_000:
        mid = (start + end) // 2
        start, end = mid - 300_000, mid + 300_000
    if w_start is not None:
        start = max(start, w_start)
    if w_end is not None:
        end = min(end, w_end)
    return start, max(end, start + 60_000)


def build_report(
    *,
    kind: str,
    title: str,
    candidate: BacktestOutput,
    published: BacktestOutput | None,
    rules: list[RuleChange],
    quality: dict | None = None,
    window: dict | None = None,
    context: dict | None = None,
    trend: list[dict] | None = None,
    max_rows: int = 200,
) -> dict:
    """The report document. `kind` is "release" (candidate vs published) or "scheduled"."""
    published = published or BacktestOutput(label="published", ran=False)
    cand_by_rule = candidate.by_rule()
    pub_by_rule = published.by_rule()
    start_ms, end_ms = _series_range(window, candidate.detections + published.detections)
    bucket_ms = choose_bucket_ms(end_ms - start_ms)
    n_buckets = max(1, -(-(end_ms - start_ms + 1) // bucket_ms))

    rule_rows: list[dict] = []
    series: dict[str, dict] = {}
    changes: dict[str, dict] = {}
    for change in rules:
        rid = change.rule_id
        cands = cand_by_rule.get(rid, [])
        pubs = pub_by_rule.get(rid, [])
        meta = change.candidate or change.published or {}
        cand_stats = _side_stats(candidate, rid, cands) if change.candidate is not None else None
        pub_stats = _side_stats(published, rid, pubs) if change.published is not None else None
        row = {
            "rule_id": rid,
            "name": meta.get("name"),
            "rule_type": meta.get("rule_type"),
            "status": change.status,
            "candidate_version": (change.candidate or {}).get("version"),
            "published_version": (change.published or {}).get("version"),
            "candidate": cand_stats,
            "published": pub_stats,
            "diff": rule_diff_text(change) if kind == "release" else "",
        }
        if kind == "release":
            rd = diff_detections(cands if change.candidate is not None else [], pubs if published.ran else [])
            row.update({"added": len(rd.added), "removed": len(rd.removed), "unchanged_alerts": rd.common})
            changes[rid] = {
                "added": [_row(d) for d in rd.added[:max_rows]],
                "removed": [_row(d) for d in rd.removed[:max_rows]],
                "added_truncated": len(rd.added) > max_rows,
                "removed_truncated": len(rd.removed) > max_rows,
            }
        rule_rows.append(row)
        series[rid] = {
            "candidate": time_series(cands, start_ms, bucket_ms, n_buckets),
            "published": time_series(pubs, start_ms, bucket_ms, n_buckets) if published.ran else None,
        }

    marks: list[dict] = []
    if quality is not None and not quality.get("success", True):
        failed = quality.get("failed_expectations", 0)
        marks.append(
            {
                "level": "error",
                "text": f"Data quality checks FAILED ({failed} expectation(s) not met): the history this "
                "backtest read may be incomplete or malformed; see the Data quality section.",
            }
        )
    if quality is not None and quality.get("malformed"):
        marks.append(
            {"level": "warning", "text": f"{quality['malformed']} history line(s) are not JSON objects (dead-lettered by the backtest)."}
        )
    for side in (candidate, published):
        if side.ran and int(side.summary.get("dead_letter") or 0) > 0:
            marks.append(
                {
                    "level": "warning",
                    "text": f"The {side.label} backtest dead-lettered {side.summary['dead_letter']} record(s).",
                }
            )
    if kind == "release" and not published.ran:
        marks.append({"level": "info", "text": "No published version of these rules is live: every alert is new."})

    return {
        "report_version": REPORT_VERSION,
        "kind": kind,
        "title": title,
        "generated_at": datetime.now(tz=UTC).isoformat(timespec="seconds").replace("+00:00", "Z"),
        "context": context or {},
        "window": window or {"start": ms_to_iso(start_ms), "end": ms_to_iso(end_ms)},
        "marks": marks,
        "quality": quality,
        "rules": rule_rows,
        "series": {
            "start": ms_to_iso(start_ms),
            "bucket_ms": bucket_ms,
            "buckets": n_buckets,
            "labels": [ms_to_iso(start_ms + i * bucket_ms) for i in range(n_buckets)],
            "rules": series,
        },
        "changes": changes,
        "totals": {
            "candidate_detections": sum(len(v) for k, v in cand_by_rule.items() if k in series),
            "published_detections": sum(len(v) for k, v in pub_by_rule.items() if k in series)
            if published.ran
            else None,
            "added": sum(r.get("added", 0) for r in rule_rows),
            "removed": sum(r.get("removed", 0) for r in rule_rows),
        },
        "backtests": {
            "candidate": candidate.summary if candidate.ran else None,
            "published": published.summary if published.ran else None,
        },
        "trend": trend or [],
    }
