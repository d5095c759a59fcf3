"""A platform start never publishes what nobody approved (spark_jobs.lifecycle.bootstrap).

Unit level: the topic and the publisher are fakes here; the acceptance test on the real
broker and Airflow is tests/integration/test_platform_up.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

from spark_jobs.lifecycle import audit
from spark_jobs.lifecycle.bootstrap import start_rules

RULE = """rule_id: {rid}
version: "{version}"
rule_type: threshold
source_topic: events.raw
conditions:
  - {{field: type, operator: "==", value: purchase}}
  - {{field: value, operator: ">=", value: {threshold}}}
"""


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=Rita", "-c", "user.email=rita@example.com", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


def _repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    (repo / "rules").mkdir(parents=True)
    (repo / "rules" / "big.yaml").write_text(RULE.format(rid="big", version="1", threshold=100))
    _git(tmp_path, "init", "-q", "-b", "main", str(repo))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "rules")
    return repo


class Topic:
    """rules.active as a dict; publish() records what it was asked to send."""

    def __init__(self) -> None:
        self.live: dict[str, dict] = {}
        self.sent: list[tuple[str, str | None]] = []

    def publish(self, rules: list, commit: str | None) -> dict[str, tuple[int, int]]:
        from spark_jobs.rules.model import rule_to_json_dict

        for r in rules:
            self.live[r.rule_id] = rule_to_json_dict(r)
            self.sent.append((r.rule_id, commit))
        return {r.rule_id: (0, len(self.sent) - 1) for r in rules}


def test_an_empty_topic_is_bootstrapped_from_head_and_audited_as_such(tmp_path: Path) -> None:
    repo, topic, audit_dir = _repo(tmp_path), Topic(), tmp_path / "audit"
    head = _git(repo, "rev-parse", "HEAD")
    # An uncommitted edit is not what HEAD says: it must not go out.
    (repo / "rules" / "big.yaml").write_text(RULE.format(rid="big", version="2", threshold=5))
    out = start_rules(repo / "rules", audit_dir, lambda: dict(topic.live), topic.publish)
    assert out.bootstrapped and topic.sent == [("big", head)]
    assert topic.live["big"]["version"] == "1" and topic.live["big"]["conditions"][1]["value"] == 100
    assert out.uncommitted == ["rules/big.yaml"]
    [rec] = audit.read_records(audit_dir)
    assert rec["event"] == "published" and rec["bootstrap"] is True and rec["approved_by"] is None
    assert rec["commit"] == head and [r["version"] for r in rec["rules"]] == ["1"]


def test_a_start_with_live_rules_publishes_nothing_and_names_the_files_that_wait(tmp_path: Path) -> None:
    repo, topic, audit_dir = _repo(tmp_path), Topic(), tmp_path / "audit"
    start_rules(repo / "rules", audit_dir, lambda: dict(topic.live), topic.publish)
    before = audit.read_records(audit_dir)
    # A commit that waits for approval, and a new rule nobody committed.
    (repo / "rules" / "big.yaml").write_text(RULE.format(rid="big", version="2", threshold=90))
    _git(repo, "commit", "-qam", "lower the threshold")
    (repo / "rules" / "new.yaml").write_text(RULE.format(rid="new", version="1", threshold=1))
    topic.sent.clear()
    out = start_rules(repo / "rules", audit_dir, lambda: dict(topic.live), topic.publish)
    assert not out.bootstrapped and topic.sent == [] and topic.live["big"]["version"] == "1"
    assert audit.read_records(audit_dir) == before
    said = "\n".join(out.lines("rules"))
    assert "nothing published at start" in said and "wait for a release" in said
    assert "rules/big.yaml: big v2 here, v1 live" in said and "rules/new.yaml: new v1 is new (not live)" in said


def test_an_emptied_topic_gets_the_last_approved_release_back_not_head(tmp_path: Path) -> None:
    repo, topic, audit_dir = _repo(tmp_path), Topic(), tmp_path / "audit"
    approved = _git(repo, "rev-parse", "HEAD")
    audit.append_record(audit_dir, {"event": "published", "commit": approved, "rules": []})
    (repo / "rules" / "big.yaml").write_text(RULE.format(rid="big", version="2", threshold=90))
    _git(repo, "commit", "-qam", "waits for approval")
    out = start_rules(repo / "rules", audit_dir, lambda: dict(topic.live), topic.publish)
    assert out.bootstrapped and topic.sent == [("big", approved)] and topic.live["big"]["version"] == "1"
    assert "the last approved release" in out.source
    assert [d.describe() for d in out.drift] == ["rules/big.yaml: big v2 here, v1 live"]


def test_an_invalid_bootstrap_publishes_nothing_and_says_file_and_field(tmp_path: Path) -> None:
    repo, topic, audit_dir = _repo(tmp_path), Topic(), tmp_path / "audit"
    (repo / "rules" / "big.yaml").write_text(RULE.format(rid="big", version="1", threshold="[1, 2]"))
    _git(repo, "commit", "-qam", "broken")
    out = start_rules(repo / "rules", audit_dir, lambda: dict(topic.live), topic.publish)
    assert out.errors and topic.sent == [] and audit.read_records(audit_dir) == []
    said = "\n".join(out.lines("rules"))
    assert "rules/big.yaml" in said and "conditions" in said and "nothing published" in said
