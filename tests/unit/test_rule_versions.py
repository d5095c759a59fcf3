"""The live job's threshold rule-set versions directory (spark_jobs/streaming/rule_versions.py):
what the driver writes, and that pruning keeps what a batch may still need."""

from __future__ import annotations

import hashlib
import json
import os
import time

from spark_jobs.rules.model import parse_rule
from spark_jobs.streaming.rule_versions import batch_versions, current, prune, publish
from spark_jobs.streaming.rules_source import rule_rows


def _rows(version: str, amount: int):
    rule = parse_rule({"rule_id": "big", "version": version, "rule_type": "threshold", "source_topic": "t",
                       "name": "Big one", "conditions": [{"field": "amount", "operator": ">", "value": amount}]})
    return rule_rows(rule, routed_topic="")


def test_publish_names_each_spec_by_its_hash_and_points_current_at_it(tmp_path):
    first = publish(tmp_path, _rows("1", 10))
    spec_text = (tmp_path / "specs" / f"{first}.json").read_text()
    assert hashlib.sha256(spec_text.encode()).hexdigest() == first
    entry = json.loads(spec_text)["threshold"][0]
    assert (entry["id"], entry["version"], entry["name"], entry["topic"]) == ("big", "1", "Big one", "t")
    assert current(tmp_path) == first
    assert publish(tmp_path, _rows("1", 10)) == first  # the same rules: the same version
    second = publish(tmp_path, _rows("2", 100))
    assert second != first and current(tmp_path) == second
    assert (tmp_path / "specs" / f"{first}.json").read_text() == spec_text  # never rewritten


def test_prune_forgets_old_batches_and_the_specs_only_they_named(tmp_path):
    old = publish(tmp_path, _rows("1", 10))
    kept = publish(tmp_path, _rows("2", 20))
    latest = publish(tmp_path, _rows("3", 30))
    batches = tmp_path / "batches"
    batches.mkdir()
    for batch, digest in [(5, old), (6, old), (7, kept), (8, kept)]:
        (batches / str(batch)).write_text(digest)
    long_ago = time.time() - 3600
    for spec in (tmp_path / "specs").iterdir():
        os.utime(spec, (long_ago, long_ago))
    prune(tmp_path, before_batch=7)
    assert batch_versions(tmp_path) == {7: kept, 8: kept}
    assert {p.stem for p in (tmp_path / "specs").iterdir()} == {kept, latest}  # latest: `current`


def test_prune_keeps_a_new_spec_no_batch_names_yet(tmp_path):
    first = publish(tmp_path, _rows("1", 10))
    publish(tmp_path, _rows("2", 20))
    prune(tmp_path, before_batch=100)
    # Not `current` any more and named by no batch, but written just now: a batch that
    # read `current` a moment ago may be recording it.
    assert (tmp_path / "specs" / f"{first}.json").exists()


class _Query:
    """A streaming query as the run loop sees it: its last progress and trigger state."""

    def __init__(self, batch: int | None, active: bool) -> None:
        self.lastProgress = None if batch is None else {"batchId": batch}
        self.status = {"isTriggerActive": active}


def test_a_change_is_in_force_only_once_the_batch_in_flight_at_its_publish_has_finished():
    from spark_jobs.streaming.job import _last_batch, _started_since

    # Published while batch 8 ran (7 had finished): batch 8 may hold the old version.
    running = _Query(7, active=True)
    finished = _last_batch(running)
    assert finished == 7
    assert not _started_since(running, finished)
    assert not _started_since(_Query(7, active=True), finished)
    # Batch 8 has finished: whatever runs now started after the publish.
    assert _started_since(_Query(8, active=True), finished)
    # No batch running (a micro-batch query between triggers): the next one reads it.
    assert _started_since(_Query(7, active=False), finished)
    # Before the first batch finished, batch 0 may be the one in flight.
    assert _last_batch(_Query(None, active=True)) == -1
    assert not _started_since(_Query(None, active=True), -1)
    assert _started_since(_Query(0, active=True), -1)
