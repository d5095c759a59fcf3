"""The rule-set versions of a live query, as files in its checkpoint.

The live plan holds no rule: it calls the JVM evaluator with this directory
(`rule_set.live_thresholds`, `rule_set.live_keyed`; the keyed operators read the same),
and each micro-batch is judged by one version of the rule set, decided by the batch's
first task and recorded under the batch's id (`ruleplatform.rules.BatchVersions`). So
a rule change needs no new plan (no query restart), and a batch run again after a
crash judges its events with the versions it had the first time: the same detections,
the same detection ids.

    DIR/specs/HASH.json   one rule-set spec per version (rule_set.live_spec), named by
                          the SHA-256 of its text; written once, never changed
    DIR/current           the HASH the next batch takes (written by the driver)
    DIR/batches/ID        the HASH batch ID took (written by the batch's first task)

Every file is written whole under another name and then renamed (or linked), so a
reader never sees part of one. The directory must be readable and writable by the
executors, as a streaming checkpoint must be.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from spark_jobs.engine.rule_set import WarmState, live_spec
from spark_jobs.streaming.rules_source import RuleRow

CURRENT = "current"
SPECS = "specs"
BATCHES = "batches"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def publish(versions_dir: Path, rows: Sequence[RuleRow], warm: Mapping[str, WarmState] | None = None) -> str:
    """Make the spec of the rule rows in force (`rows`, `warm`: their warm-up state,
    warmup.py) the version the next micro-batch takes; returns its hash. Batches
    already recorded keep theirs."""
    spec = live_spec(rows, warm)
    digest = hashlib.sha256(spec.encode()).hexdigest()
    path = versions_dir / SPECS / f"{digest}.json"
    if not path.exists():
        _write(path, spec)
    if current(versions_dir) != digest:
        _write(versions_dir / CURRENT, digest)
    return digest


def current(versions_dir: Path) -> str | None:
    path = versions_dir / CURRENT
    return path.read_text().strip() if path.exists() else None


def batch_versions(versions_dir: Path) -> dict[int, str]:
    """The hash each recorded micro-batch took, by batch id."""
    folder = versions_dir / BATCHES
    if not folder.is_dir():
        return {}
    return {int(p.name): p.read_text().strip() for p in folder.iterdir() if p.name.isdigit()}


# A spec no batch names yet may be the one a starting batch is recording: it stays this
# long after it was written.
SPEC_GRACE_S = 600.0


def prune(versions_dir: Path, before_batch: int) -> None:
    """Forget the batches before `before_batch` (which the checkpoint no longer runs
    again) and the specs that neither a kept batch nor `current` names (after
    SPEC_GRACE_S): the directory stays as large as the checkpoint's retained batches."""
    kept: set[str] = {h for h in [current(versions_dir)] if h}
    for batch, digest in batch_versions(versions_dir).items():
        if batch < before_batch:
            (versions_dir / BATCHES / str(batch)).unlink(missing_ok=True)
        else:
            kept.add(digest)
    old = time.time() - SPEC_GRACE_S
    for spec in (versions_dir / SPECS).glob("*.json"):
        if spec.stem not in kept and spec.stat().st_mtime < old:
            spec.unlink(missing_ok=True)
