"""The slice of event history a backtest reads, and its time window.

A backtest of "recent history" needs a window: it ends at the newest recorded event
(`history_window_end: latest`, for recordings) or at the run's data interval end
(`interval`, for daily exports), and reaches `history_lookback_hours` back. Topics
that only serve as correlation context reach further back by the longest correlation
lookback, since a primary at the window start may need context from before it.
Records without a usable timestamp are kept: the backtest dead-letters them and the
data-quality suite counts them, which is more honest than dropping them silently.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from spark_jobs.quality.runner import read_records
from spark_jobs.quality.suite import topic_fields
from spark_jobs.report.timeparse import get_path, ms_to_iso, to_epoch_ms
from spark_jobs.rules.model import AnyRule, CorrelationRule


@dataclass(frozen=True)
class Window:
    start_ms: int
    end_ms: int
    per_topic: dict[str, tuple[int, int]]
    anchor: str

    def to_dict(self) -> dict:
        return {
            "start": ms_to_iso(self.start_ms),
            "end": ms_to_iso(self.end_ms),
            "anchor": self.anchor,
            "topics": {t: {"start": ms_to_iso(a), "end": ms_to_iso(b)} for t, (a, b) in self.per_topic.items()},
        }


def _time_fields(rules: list[AnyRule], topics: Iterable[str], time_field: str) -> dict[str, list[str]]:
    per = topic_fields(rules, time_field)
    out = {}
    for t in topics:
        fields = sorted((per.get(t).time_fields if per.get(t) else set()) - {time_field})
        out[t] = [time_field, *fields]
    return out


def record_time_ms(record: Mapping, fields: list[str]) -> int | None:
    for f in fields:
        ms = to_epoch_ms(get_path(record, f))
        if ms is not None:
            return ms
    return None


def compute_window(
    inputs: Mapping[str, str],
    rules: list[AnyRule],
    *,
    time_field: str,
    lookback_hours: float,
    anchor: str,
    interval_end: datetime | None = None,
) -> Window:
    """The history window for these inputs and rules (see module docstring)."""
    tfields = _time_fields(rules, inputs, time_field)
    lookback_ms = int(lookback_hours * 3_600_000)
    if anchor == "interval" and interval_end is not None:
        end = int(interval_end.timestamp() * 1000)
    else:
        latest = None
        for topic, path in inputs.items():
            records, _ = read_records(path)
            for rec in records:
                ms = record_time_ms(rec, tfields[topic])
                if ms is not None and (latest is None or ms > latest):
                    latest = ms
        end = latest if latest is not None else int(datetime.now().timestamp() * 1000)
        anchor = "latest"
    start = end - lookback_ms
    sources = {r.source_topic for r in rules if r.enabled}
    context_back = max(
        (r.window_ms for r in rules if r.enabled and isinstance(r, CorrelationRule)), default=0
    )
    per_topic = {}
    for topic in inputs:
        is_context_only = topic not in sources and any(
            isinstance(r, CorrelationRule) and r.context_topic == topic for r in rules
        )
        per_topic[topic] = (start - context_back if is_context_only else start, end)
    return Window(start, end, per_topic, anchor)


def slice_inputs(
    inputs: Mapping[str, str],
    rules: list[AnyRule],
    window: Window,
    out_dir: Path,
    *,
    time_field: str,
    enabled: bool = True,
) -> dict[str, dict]:
    """Write each input's in-window records to out_dir/<topic>.jsonl; returns per-topic stats.

    With `enabled` false the inputs are passed through unchanged (already one window each).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    tfields = _time_fields(rules, inputs, time_field)
    result: dict[str, dict] = {}
    for topic, src in inputs.items():
        if not enabled:
            result[topic] = {"path": str(src), "source": str(src), "kept": None, "dropped": 0}
            continue
        lo, hi = window.per_topic[topic]
        target = out_dir / f"{topic}.jsonl"
        kept = dropped = 0
        with target.open("w", encoding="utf-8") as out:
            for line, rec in _lines(Path(src)):
                ms = record_time_ms(rec, tfields[topic]) if isinstance(rec, dict) else None
                if ms is not None and not (lo <= ms <= hi):
                    dropped += 1
                    continue
                out.write(line if line.endswith("\n") else line + "\n")
                kept += 1
        result[topic] = {"path": str(target), "source": str(src), "kept": kept, "dropped": dropped}
    return result


def _lines(path: Path) -> Iterable[tuple[str, object]]:
    """(raw line, parsed JSON or None) of a JSON Lines file; Parquet rows as JSON lines."""
    if path.is_dir() or path.suffix == ".parquet":
        records, _ = read_records(path)
        for rec in records:
            yield json.dumps(rec), rec
        return
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                yield line, json.loads(line)
            except json.JSONDecodeError:
                yield line, None
