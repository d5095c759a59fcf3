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
