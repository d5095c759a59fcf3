"""The evidence chain's checks (spark_jobs/lifecycle/evidence.py) on hand-made records.

Unit level: Kafka records, audit records and files are made here. The acceptance test on
the real platform (broker, Spark, Airflow on PostgreSQL, the archive, git) is
tests/integration/test_platform_up.py::test_a_shadow_release_is_approved_compared_promoted_and_explained.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from spark_jobs.kafka.admin import KafkaRecord
from spark_jobs.lifecycle.evidence import (
    find_detection,
    release_record,
    report_link,
    rule_text_link,
    spec_detection_id,
)


def _rec(topic: str, offset: int, value: dict | bytes, *, key: str = "r1", ts: int = 1_000, partition: int = 0,
         headers: tuple = ()) -> KafkaRecord:
    raw = value if isinstance(value, bytes) else json.dumps(value, separators=(",", ":")).encode()
    return KafkaRecord(topic, partition, offset, key.encode(), raw, ts, 0, headers)


def test_the_detection_id_is_the_specs_sha256() -> None:
    # The vector of tests/conformance/vectors/record_without_name.yaml, hashed with
    # coreutils: printf 't_noname\x1f1\x1fevents.raw\x1f{"id":"e0","kind":"x"}' | sha256sum
    assert spec_detection_id("t_noname", "1", "events.raw", b'{"id":"e0","kind":"x"}') == "ec6f267ee59151f20b7ddee6b6fbb8a8"


def test_the_first_detection_of_a_version_is_the_earliest_by_broker_time_whatever_the_partition() -> None:
    sink = [
        _rec("events.processed", 0, {"rule_id": "r1", "rule_version": "1", "detection_id": "a" * 32}, ts=500),
        _rec("events.processed", 1, {"rule_id": "r1", "rule_version": "2", "detection_id": "b" * 32}, ts=900),
        _rec("events.processed", 0, {"rule_id": "r1", "rule_version": "2", "detection_id": "c" * 32}, ts=800,
             partition=1),
        _rec("events.processed", 2, {"rule_id": "r2", "rule_version": "2", "detection_id": "d" * 32}, ts=100),
        _rec("events.processed", 3, b"not json", ts=50),
        _rec("events.processed", 4, {"rule_id": "r1", "rule_version": "2", "detection_id": "e" * 32}, ts=1200),
    ]
    found = find_detection(sink, "e" * 32)
    assert found is not None and found.record.offset == 4
    assert found.first_doc["detection_id"] == "c" * 32 and found.first.partition == 1
    assert find_detection(sink, "f" * 32) is None


def test_the_release_of_a_version_is_the_published_record_that_produced_it() -> None:
    audit = [
        {"event": "published", "commit": "c1", "rules": [{"rule_id": "r1", "version": "1", "produced": True}]},
        {"event": "rejected", "commit": "c2", "rules": [{"rule_id": "r1", "version": "2", "produced": False}]},
        {"event": "published", "commit": "c3", "rules": [{"rule_id": "r1", "version": "2", "produced": True}]},
        {"event": "published", "commit": "c4", "rules": [{"rule_id": "r1", "version": "2", "produced": False}]},
    ]
    assert release_record(audit, "r1", "2")[0]["commit"] == "c3"
    assert release_record(audit, "r1", "1")[0]["commit"] == "c1"
    assert release_record(audit, "r1", "3") is None


def test_the_rule_record_must_carry_the_releases_commit() -> None:
    rule = {"rule_id": "r1", "version": "2"}
    topic = [_rec("rules.active", 0, {"rule_id": "r1", "version": "1"}, headers=(("commit", b"c1"),)),
             _rec("rules.active", 1, rule, headers=(("commit", b"c3"),))]
    entry = {"rule_id": "r1", "version": "2", "partition": 0, "offset": 1}
    link, doc = rule_text_link(topic, "rules.active", {"commit": "c3"}, entry)
    assert link.ok is True and doc == rule
    link, _ = rule_text_link(topic, "rules.active", {"commit": "c9"}, entry)
    assert link.ok is False and "commit header" in link.check
    # The audit's offset pointing at another version is caught too.
    link, _ = rule_text_link(topic, "rules.active", {"commit": "c3"}, {**entry, "offset": 0})
    assert link.ok is False and "version" in link.check
    link, _ = rule_text_link(topic, "rules.active", {"commit": "c3"}, {**entry, "offset": 7})
    assert link.ok is False and "no record" in link.check
    # A shadow version's record is keyed `<rule_id>@shadow`.
    shadow = {"rule_id": "r1", "version": "3", "mode": "shadow"}
    topic.append(_rec("rules.active", 2, shadow, key="r1@shadow", headers=(("commit", b"c4"),)))
    link, doc = rule_text_link(topic, "rules.active", {"commit": "c4"}, {**entry, "version": "3", "offset": 2,
                                                                          "mode": "shadow"})
    assert link.ok is True and doc == shadow
    link, _ = rule_text_link(topic, "rules.active", {"commit": "c4"}, {**entry, "version": "3", "offset": 2})
    assert link.ok is False and "key" in link.check


def test_a_report_changed_after_the_approval_breaks_the_chain(tmp_path: Path) -> None:
    report = tmp_path / "report.html"
    report.write_text("<html>what the approver saw</html>")
    kept = hashlib.sha256(report.read_bytes()).hexdigest()
    release = {"report": str(report), "report_sha256": {"report.html": kept}}
    assert report_link(release).ok is True
    report.write_text("<html>something else</html>")
    assert report_link(release).ok is False
    report.unlink()
    assert report_link(release).ok is False
    assert report_link({"bootstrap": True}).ok is None


def test_the_commit_link_compares_the_file_with_what_the_publish_made_of_it(tmp_path: Path) -> None:
    import subprocess

    from spark_jobs.lifecycle.evidence import commit_link

    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "r1.yaml").write_text(
        'rule_id: r1\nversion: "2"\nrule_type: threshold\nsource_topic: events.raw\n'
        "conditions:\n  - {field: amount, operator: \">=\", value: 5}\n")
    git = ["git", "-C", str(tmp_path), "-c", "user.name=A", "-c", "user.email=a@x"]
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "r1 v2"], check=True)
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    record = {"rule_id": "r1", "version": "2", "rule_type": "threshold", "source_topic": "events.raw",
              "conditions": [{"field": "amount", "operator": ">=", "value": 5}], "enabled": True, "tags": [],
              "name": None, "description": None, "owner": None}
    entry = {"rule_id": "r1", "version": "2", "file": "rules/r1.yaml"}
    assert commit_link(tmp_path, {"commit": commit}, entry, record).ok is True
    # Released as a shadow from the approval form: the file says nothing of a mode, the
    # record is that rule in mode shadow, and the audit's entry says so.
    shadow = {**record, "mode": "shadow"}
    assert commit_link(tmp_path, {"commit": commit}, {**entry, "mode": "shadow"}, shadow).ok is True
    assert commit_link(tmp_path, {"commit": commit}, entry, shadow).ok is False
    assert commit_link(tmp_path, {"commit": commit}, entry, {**record, "version": "3"}).ok is False
