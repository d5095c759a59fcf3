"""Issue 13, "the release as its users see it", without Airflow: `rulectl history` after
`rulectl up`, invalid attempts in the history, what `rulectl validate --base` says,
the start banner naming the tracked repository, the first release's base commit, and a
`check_history` log that is not buried under Great Expectations' registrations."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spark_jobs.cli import main as rulectl
from spark_jobs.commands import up
from spark_jobs.lifecycle import audit

ROOT = Path(__file__).resolve().parents[2]


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=Rita", "-c", "user.email=rita@example.com", *args],
        check=True, capture_output=True, text=True,
    ).stdout.strip()


def test_history_finds_the_audit_log_of_rulectl_up_and_lists_invalid_attempts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    # Where `rulectl up` (default workdir var/) keeps it, run from the same folder.
    audit_dir = tmp_path / "var" / "airflow" / "rule_lifecycle" / "audit"
    audit.append_record(audit_dir, {
        "event": "published", "commit": "a" * 40, "decided_by": {"name": "alice"}, "approved_by": {"name": "alice"},
        "rules": [{"rule_id": "rapid_clicks", "version": "2", "previous_version": "1", "produced": True}],
    })
    audit.append_record(audit_dir, {
        "event": "invalid", "commit": "b" * 40, "reason": "1 rule error(s)", "rules": [],
        "errors": [{"file": "rules/rapid_clicks.yaml", "field": "window_unit", "reason": "bad", "rule_id": "rapid_clicks"}],
    })
    monkeypatch.chdir(tmp_path)
    for k in [k for k in os.environ if k.startswith(("RULE_LIFECYCLE_", "AIRFLOW_HOME"))]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert rulectl(["history", "rapid_clicks", "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["event"] for r in rows] == ["published", "invalid"]
    assert rows[0]["by"] == "alice" and rows[1]["commit"] == "b" * 40


def test_history_says_where_it_looked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.chdir(tmp_path)
    for k in [k for k in os.environ if k.startswith(("RULE_LIFECYCLE_", "AIRFLOW_HOME"))]:
        monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert rulectl(["history", "rapid_clicks"]) == 2
    err = capsys.readouterr().err
    assert "var/airflow/rule_lifecycle/audit/releases.jsonl" in err and "--audit-dir" in err


def test_validate_with_base_names_the_changed_files(tmp_path: Path, capsys) -> None:
    repo = tmp_path / "repo"
    (repo / "rules").mkdir(parents=True)
    for name in ("rapid_clicks", "purchase_threshold", "global_burst"):
        (repo / "rules" / f"{name}.yaml").write_text((ROOT / "rules" / f"{name}.yaml").read_text())
    _git(repo.parent, "init", "-q", "-b", "main", str(repo))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "rules")
    path = repo / "rules" / "purchase_threshold.yaml"
    text = path.read_text()
    import re

    version = re.search(r'version: "?(\d+)"?', text).group(1)
    path.write_text(re.sub(r'version: "?\d+"?', f'version: "{int(version) + 1}"', text, count=1))
    cwd = os.getcwd()
    os.chdir(repo)
    try:
        assert rulectl(["validate", "rules", "--base", "HEAD"]) == 0
    finally:
        os.chdir(cwd)
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert out.startswith("OK: 3 valid rule(s); 1 file(s) changed since HEAD: rules/purchase_threshold.yaml"), out
    assert "purchase_threshold" in out


def test_the_start_banner_says_which_repository_and_branch_are_released_and_how_often(tmp_path: Path) -> None:
    paths = up.Paths(tmp_path)
    users = up.demo_users(paths)
    said: list[str] = []

    class FakeSupervisor:
        def describe(self) -> dict:
            return {"airflow-api-server": {"pid": 1}}

        def say(self, text: str) -> None:
            said.append(text)

    from spark_jobs.cli import build_parser

    args = build_parser().parse_args(["up", "--workdir", str(tmp_path)])
    up._banner(FakeSupervisor(), args, "127.0.0.1:9092", paths, 3, users, ("rules.active",))  # type: ignore[arg-type]
    text = "\n".join(said)
    assert f"tracks {ROOT} branch main (rules/)" in text and "polling every 5 min" in text
    assert "Variable rule_lifecycle" in text


def test_the_first_release_compares_with_what_rulectl_up_published(tmp_path: Path) -> None:
    """`rulectl up` records its bootstrap of the empty topic, so the first approval page
    names a last published commit instead of "none recorded"."""
    from spark_jobs.lifecycle.bootstrap import start_rules
    from spark_jobs.lifecycle.release import detect_candidate
    from spark_jobs.lifecycle.settings import LifecycleSettings

    repo = tmp_path / "repo"
    (repo / "rules").mkdir(parents=True)
    (repo / "rules" / "rapid_clicks.yaml").write_text((ROOT / "rules" / "rapid_clicks.yaml").read_text())
    _git(tmp_path, "init", "-q", "-b", "main", str(repo))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "rules")
    started = _git(repo, "rev-parse", "HEAD")
    paths = up.Paths(tmp_path / "var")
    topic: dict[str, dict] = {}
    out = start_rules(repo / "rules", up.audit_dir(paths), lambda: dict(topic), lambda rules, commit: {r.rule_id: (0, i) for i, r in enumerate(rules)})
    assert out.bootstrapped and out.record is not None
    assert out.record["bootstrap"] is True and out.record["approved_by"] is None and out.record["commit"] == started
    # The author changes the rule; the release DAG (same audit folder) compares with the start commit.
    path = repo / "rules" / "rapid_clicks.yaml"
    path.write_text(path.read_text().replace("threshold: 10", "threshold: 9"))
    _git(repo, "commit", "-qam", "tune")
    settings = LifecycleSettings(repo=str(repo), branch="main", state_dir=str(paths.airflow_home / "rule_lifecycle"))
    candidate = detect_candidate(settings)
    assert candidate is not None and candidate["base_commit"] == started


def test_check_history_log_is_not_flooded_by_great_expectations() -> None:
    script = (
        "import logging, sys\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout, format='%(name)s %(message)s')\n"
        "from pathlib import Path\n"
        "from spark_jobs.quality import run_quality\n"
        "from spark_jobs.rules.loader import load_rules\n"
        f"rules = [lr.rule for lr in load_rules([Path({str(ROOT / 'rules')!r})]).rules]\n"
        f"run_quality({{'events.raw': {str(ROOT / 'tests/data/demo/events.raw.jsonl')!r}}}, rules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GX_ANALYTICS_ENABLED": "False"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    gx_lines = [line for line in out.stdout.splitlines() if line.startswith("great_expectations")]
    assert len(gx_lines) < 5, gx_lines[:10]


def test_history_says_an_invalid_commit_was_invalid_and_why(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """An invalid commit released no version of the rule: the line says it was invalid
    and why (file, field, reason), not `version None (new rule)`. The record is the one
    validate_rules writes (event `invalid`, no rules, every error of the commit)."""
    from spark_jobs.lifecycle.release import ValidationFailed

    errors = [
        {"file": "rules/rapid_clicks.yaml", "field": "window_unit", "reason": "Input should be 'seconds'",
         "rule_id": "rapid_clicks"},
        {"file": "rules/rapid_clicks.yaml", "field": "threshold", "reason": "Input should be a number",
         "rule_id": "rapid_clicks"},
        {"file": "rules/big_view.yaml", "field": "conditions", "reason": "List should have at least 1 item",
         "rule_id": "big_view"},
    ]
    audit.append_record(tmp_path, {
        "event": "invalid", "commit": "c" * 40, "reason": str(ValidationFailed(errors)), "rules": [],
        "errors": errors, "dag_id": "rule_release", "run_id": "manual__1",
    })
    assert rulectl(["history", "rapid_clicks", "--audit-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1, out
    line = out[0]
    assert "INVALID" in line and "cccccccccccc" in line
    assert "rules/rapid_clicks.yaml: field 'window_unit': Input should be 'seconds'" in line
    assert "rules/rapid_clicks.yaml: field 'threshold': Input should be a number" in line
    assert "big_view" not in line  # another rule's error is not this rule's history
    assert "version None" not in line and "new rule" not in line
    # The JSON rows carry the same errors.
    assert rulectl(["history", "rapid_clicks", "--audit-dir", str(tmp_path), "--format", "json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["event"] == "invalid"
    assert [(e["field"], e["reason"]) for e in rows[0]["errors"]] == [
        ("window_unit", "Input should be 'seconds'"), ("threshold", "Input should be a number")]
