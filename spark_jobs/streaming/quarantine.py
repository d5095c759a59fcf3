"""What the live job does when a micro-batch fails anyway: isolate it and go on.

Every input the job knows to be dangerous is guarded (the poison corpus), but a batch
can still fail on something nobody foresaw. Restarted as it was, the query would read
the same offsets again (they are in its write-ahead log) and fail the same way, for
ever. So the job (streaming/job.py `run`) restarts the query in-process, and:

- the first failure of a batch is retried as it is (a broker hiccup, a lost executor);
- when the same batch fails again, its records (the offset ranges between the last
  committed batch and the failed one, read from the checkpoint's `offsets/` log) are
  *quarantined*: recorded in `CHECKPOINT/quarantine.json`, and the rebuilt plan turns
  every record in a quarantined range into a dead letter (reason `quarantined: ...`,
  the record's text kept as for any dead letter) instead of evaluating it. The batch
  then runs again from the same offsets and commits; nothing is skipped silently: each
  record of the range is on the dead-letter topic, where it can be replayed once fixed;
- a batch that fails again although its ranges are quarantined does not fail because
  of its records: the job exits 1 with the error, for the supervisor to act on.

The real-time lane (threshold_lane.py) is quarantined the same way, with one
difference: in real-time mode Spark writes a batch's `offsets/` entry (its end) and its
`commits/` entry when the batch ends, so a failed batch has no entry and no known end.
Its range runs from the last committed batch's end to the broker's end offsets at the
second failure: every record that arrived since the last commit, a few seconds' worth.

Spark's checkpoint files are only read here, never changed.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from pyspark.sql import Column
from pyspark.sql import functions as F

log = logging.getLogger(__name__)

QUARANTINE_FILE = "quarantine.json"
FAILURES_FILE = "batch_failures.json"
# Quarantined after this many failures of the same batch.
ATTEMPTS = 2


@dataclass(frozen=True)
class OffsetRange:
    topic: str
    partition: int
    start: int  # inclusive
    end: int  # exclusive
    batch_id: int
    error: str


def _write_json(path: Path, data: object) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def _source_offsets(path: Path) -> dict[str, dict[str, int]] | None:
    """The Kafka source's offsets in one file of the checkpoint's `offsets/` log: the
    line after the version and the batch metadata (the job has one source)."""
    if not path.exists():
        return None
    lines = path.read_text().splitlines()
    if len(lines) < 3:
        return None
    return json.loads(lines[2])


def uncommitted_batch(query_dir: Path) -> int | None:
    """The id of the batch planned (in `offsets/`) but not committed (no `commits/`)."""
    offsets = [int(p.name) for p in (query_dir / "offsets").glob("[0-9]*")]
    if not offsets:
        return None
    last = max(offsets)
    return None if (query_dir / "commits" / str(last)).exists() else last


def running_batch(query_dir: Path) -> int:
    """The id of a real-time query's batch in flight: the one after the last committed."""
    commits = [int(p.name) for p in (query_dir / "commits").glob("[0-9]*")]
    return max(commits, default=-1) + 1


def batch_ranges(query_dir: Path, batch_id: int, error: str,
                 end: dict[str, dict[str, int]] | None = None) -> list[OffsetRange]:
    """The offset ranges a batch read: from the previous batch's end (the start of the
    log for a partition it did not have) to its own (`end`, when the log has none)."""
    end = end if end is not None else _source_offsets(query_dir / "offsets" / str(batch_id)) or {}
    start = _source_offsets(query_dir / "offsets" / str(batch_id - 1)) or {}
    out = []
    for topic, parts in end.items():
        for part, hi in parts.items():
            lo = (start.get(topic) or {}).get(part, 0)
            if int(hi) > int(lo):
                out.append(OffsetRange(topic, int(part), int(lo), int(hi), batch_id, error))
    return out


class Quarantine:
    """The quarantined offset ranges and the failure counts of one checkpoint."""

    def __init__(self, checkpoint: Path, query: str = "query") -> None:
        """`query`: the directory of the query's own checkpoint under `checkpoint`
        (the keyed query's `query`, the real-time lane's `lane`)."""
        self.checkpoint = checkpoint
        self.query_dir = checkpoint / query
        prefix = "" if query == "query" else f"{query}-"
        self.path = checkpoint / f"{prefix}{QUARANTINE_FILE}"
        self.failures_path = checkpoint / f"{prefix}{FAILURES_FILE}"

    def ranges(self) -> list[OffsetRange]:
        if not self.path.exists():
            return []
        return [OffsetRange(**r) for r in json.loads(self.path.read_text())]

    def active_ranges(self) -> list[OffsetRange]:
        """The ranges a restarted query can still read: those of batches not committed
        (a committed batch's offsets are never read again from this checkpoint)."""
        commits = [int(p.name) for p in (self.query_dir / "commits").glob("[0-9]*")]
        done = max(commits, default=-1)
        return [r for r in self.ranges() if r.batch_id > done]

    def on_failure(self, error: str, broker_ends: Callable[[], dict[str, dict[str, int]]] | None = None) -> str:
        """Decide what a failed query does next: `retry` (restart it as it is),
        `quarantined` (its batch's records are quarantined; restart it) or `give_up`.

        `broker_ends` (topic -> partition -> end offset) marks a real-time query: its
        failed batch ends there."""
        query_dir = self.query_dir
        batch = uncommitted_batch(query_dir) if broker_ends is None else running_batch(query_dir)
        if batch is None:
            return "give_up"  # not a batch's failure (planning, start-up): nothing to isolate
        failures = json.loads(self.failures_path.read_text()) if self.failures_path.exists() else {}
        failures = {k: v for k, v in failures.items() if int(k) >= batch}  # older batches committed since
        count = failures.get(str(batch), 0) + 1
        failures[str(batch)] = count
        self.checkpoint.mkdir(parents=True, exist_ok=True)
        _write_json(self.failures_path, failures)
        if count < ATTEMPTS:
            log.warning("micro-batch %s failed (attempt %s): %s; retrying it", batch, count, error[:500])
            return "retry"
        ranges = batch_ranges(query_dir, batch, error[:1000], None if broker_ends is None else broker_ends())
        known = self.ranges()
        if not ranges or all(r in known for r in ranges):
            return "give_up"
        _write_json(self.path, [asdict(r) for r in known + [r for r in ranges if r not in known]])
        log.error("batch %s of %s failed %s times: quarantining its records (%s) to the dead-letter topic: %s",
                  batch, query_dir, count, ", ".join(f"{r.topic}[{r.partition}] {r.start}..{r.end - 1}" for r in ranges),
                  error[:500])
        return "quarantined"


def quarantine_reason(ranges: list[OffsetRange], batch: str = "micro-batch") -> Column:
    """Per input record: the dead-letter reason when it is in a quarantined range, NULL
    otherwise (reads the Kafka source's `topic`, `partition` and `offset`); `batch`
    names the query's kind of batch in the reason."""
    reason: Column = F.lit(None).cast("string")
    for r in ranges:
        inside = ((F.col("topic") == F.lit(r.topic)) & (F.col("partition") == F.lit(r.partition))
                  & (F.col("offset") >= F.lit(r.start)) & (F.col("offset") < F.lit(r.end)))
        text = f"quarantined: {batch} {r.batch_id} failed {ATTEMPTS} times on these records: {r.error}"
        reason = F.when(inside, F.lit(text)).otherwise(reason)
    return reason
