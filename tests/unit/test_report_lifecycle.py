"""The release steps behind the DAGs as plain functions: settings, git polling, validation
against the live rules, history window, audit log and `rulectl history` (no Airflow)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from spark_jobs.cli import main as rulectl
from spark_jobs.lifecycle import audit, release
from spark_jobs.lifecycle.history import compute_window, slice_inputs
from spark_jobs.lifecycle.settings import LifecycleSettings, env_settings, resolve_settings
from spark_jobs.rules.model import parse_rule

RULE = """rule_id: rapid_clicks
version: "1"
rule_type: velocity
source_topic: events.raw
conditions:
  - {field: type, operator: "==", value: click}
group_by: user_id
window_size: 10
window_unit: seconds
aggregation_type: count
threshold: 10
time_mode: event_time
timestamp_field: timestamp
"""


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=Rita", "-c", "user.email=r@example.com", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    r = tmp_path / "repo"
    (r / "rules").mkdir(parents=True)
    (r / "rules" / "rapid_clicks.yaml").write_text(RULE)
    git(r, "init", "-q", "-b", "main")
    git(r, "add", "-A")
    git(r, "commit", "-q", "-m", "initial")
    return r


@pytest.fixture
def settings(repo: Path, tmp_path: Path) -> LifecycleSettings:
    return LifecycleSettings(repo=str(repo), state_dir=str(tmp_path / "state"))


def commit(repo: Path, path: str, text: str, msg: str) -> str:
    (repo / path).parent.mkdir(parents=True, exist_ok=True)
    (repo / path).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", msg)
    return git(repo, "rev-parse", "HEAD")


def live_of(text: str) -> dict[str, dict]:
    import yaml

    from spark_jobs.rules.model import rule_to_json_dict

    r = parse_rule(yaml.safe_load(text))
    return {r.rule_id: rule_to_json_dict(r)}


def test_settings_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    s = LifecycleSettings(state_dir=str(tmp_path))
    assert s.report_dir == str(tmp_path / "reports") and s.audit_dir == str(tmp_path / "audit")
    assert s.spark_master == "local[2]" and s.rules_topic == "rules.active"
    env = {
        "RULE_LIFECYCLE_BRANCH": "release",
        "RULE_LIFECYCLE_HISTORY_INPUTS": "events.raw=/a.jsonl,context.raw=/b",
        "RULE_LIFECYCLE_HISTORY_LOOKBACK_HOURS": "6",
        "RULE_LIFECYCLE_HISTORY_SLICE": "false",
    }
    assert env_settings(env) == {
        "branch": "release",
        "history_inputs": {"events.raw": "/a.jsonl", "context.raw": "/b"},
        "history_lookback_hours": 6.0,
        "history_slice": False,
    }
    monkeypatch.setenv("RULE_LIFECYCLE_BRANCH", "release")
    assert resolve_settings({"branch": "hotfix"}, use_airflow=False).branch == "hotfix"
    assert resolve_settings(use_airflow=False).branch == "release"
    with pytest.raises(ValueError, match="unknown rule_lifecycle setting"):
        LifecycleSettings.from_dict({"brnach": "x"})
    with pytest.raises(ValueError, match="history_window_end"):
        LifecycleSettings(history_window_end="tomorrow")


def test_detect_runs_once_per_new_rules_commit(repo: Path, settings: LifecycleSettings) -> None:
    head = git(repo, "rev-parse", "HEAD")
    cand = release.detect_candidate(settings)
    assert cand and cand["commit"] == head and cand["subject"] == "initial" and cand["base_commit"] is None
    release.record_decision(cand, None, event="published", dag_id="d", run_id="r1")
    assert release.detect_candidate(settings) is None  # decided already
    commit(repo, "README.md", "docs", "docs only")
    assert release.detect_candidate(settings) is None  # nothing under rules/ changed
    c2 = commit(repo, "rules/rapid_clicks.yaml", RULE.replace('"1"', '"2"'), "bump")
    cand2 = release.detect_candidate(settings)
    assert cand2["commit"] == c2 and cand2["base_commit"] == head
    release.record_decision(cand2, None, event="rejected", dag_id="d", run_id="r2")
    assert release.detect_candidate(settings) is None  # a rejected commit is not retried by the poller
    assert release.detect_candidate(settings, commit=c2)["commit"] == c2  # but can be released by hand


def test_validation_fails_with_file_field_reason(repo: Path, settings: LifecycleSettings) -> None:
    commit(repo, "rules/rapid_clicks.yaml", RULE.replace("seconds", "weeks"), "typo")
    cand = release.detect_candidate(settings)
    with pytest.raises(release.ValidationFailed) as info:
        release.validate_candidate(cand, {})
    (err,) = info.value.errors
    assert err["file"] == "rules/rapid_clicks.yaml" and err["field"] == "window_unit"
    assert "rules/rapid_clicks.yaml: field 'window_unit'" in str(info.value)


def test_validation_compares_with_the_live_rules(repo: Path, settings: LifecycleSettings) -> None:
    live = live_of(RULE)
    cand = release.detect_candidate(settings)
    assert release.validate_candidate(cand, live)["changed_rule_ids"] == []
    commit(repo, "rules/rapid_clicks.yaml", RULE.replace("threshold: 10", "threshold: 8"), "no bump")
    cand = release.detect_candidate(settings)
    with pytest.raises(release.ValidationFailed, match="version"):
        release.validate_candidate(cand, live)  # changed content, same version as live
    commit(repo, "rules/rapid_clicks.yaml", RULE.replace("threshold: 10", "threshold: 8").replace('"1"', '"2"'), "ok")
    commit(repo, "rules/other.yaml", RULE.replace("rapid_clicks", "other"), "new rule")
    cand = release.detect_candidate(settings)
    v = release.validate_candidate(cand, {**live, "gone": {"rule_id": "gone", "version": "1"}})
    assert v["changed_rule_ids"] == ["other", "rapid_clicks"]
    assert v["removed_rule_ids"] == ["gone"]
    assert [r["version"] for r in release.rules_to_publish(v)] == ["1", "2"]
    assert Path(v["checkout"], "rules", "other.yaml").exists()


def test_history_window_and_slice(tmp_path: Path) -> None:
    rule = parse_rule(json.loads(json.dumps(__import__("yaml").safe_load(RULE))))
    src = tmp_path / "events.jsonl"
    src.write_text(
        "\n".join(
            [
                json.dumps({"type": "click", "timestamp": "2026-01-05T12:00:00Z"}),
                json.dumps({"type": "click", "timestamp": "2026-01-03T12:00:00Z"}),  # older than 24 h
                json.dumps({"type": "click"}),  # no time: kept for the dead-letter count
                "not json",
            ]
        )
        + "\n"
    )
    window = compute_window({"events.raw": str(src)}, [rule], time_field="timestamp", lookback_hours=24, anchor="latest")
    assert window.to_dict()["end"] == "2026-01-05T12:00:00.000Z" and window.to_dict()["start"] == "2026-01-04T12:00:00.000Z"
    out = slice_inputs({"events.raw": str(src)}, [rule], window, tmp_path / "sliced", time_field="timestamp")
    assert out["events.raw"]["kept"] == 3 and out["events.raw"]["dropped"] == 1
    assert "2026-01-03" not in Path(out["events.raw"]["path"]).read_text()


def test_audit_answers_who_approved_a_version(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    s = LifecycleSettings(state_dir=str(tmp_path))
    cand = {"commit": "c" * 40, "base_commit": None, "repo": "r", "branch": "main", "settings": s.to_dict()}
    validation = {
        "changed_rule_ids": ["rapid_clicks"],
        "rules": {"rapid_clicks": {"rule_id": "rapid_clicks", "version": "3"}},
        "files": {"rapid_clicks": "rules/rapid_clicks.yaml"},
        "live_versions": {"rapid_clicks": "2"},
    }
    approval = release.approval_outcome(
        {
            "chosen_options": ["Approve"],
            "params_input": {"comment": "ship it"},
            "responded_at": "2026-01-05T12:00:00Z",
            "responded_by_user": {"id": "alice", "name": "alice"},
        }
    )
    assert approval["approved"] and approval["comment"] == "ship it"
    release.record_decision(
        cand, validation, event="published", dag_id="rule_release", run_id="run1",
        approval=approval, published={"published": ["rapid_clicks"], "unchanged": []},
    )
    assert audit.last_published_commit(s.audit_dir) == "c" * 40
    assert rulectl(["history", "rapid_clicks", "--audit-dir", s.audit_dir, "--version", "3"]) == 0
    out = capsys.readouterr().out
    assert "version 3 (was 2)  published by alice  commit cccccccccccc" in out and "ship it" in out
    assert rulectl(["history", "nope", "--audit-dir", s.audit_dir]) == 1
    assert rulectl(["history", "x", "--audit-dir", str(tmp_path / "none")]) == 2
    (Path(s.audit_dir) / "releases.jsonl").open("a").write('{"torn": ')  # a crash mid-write
    assert len(audit.read_records(s.audit_dir)) == 1


def test_backtest_args_match_the_backtest_cli() -> None:
    from spark_jobs.commands.backtest import add_arguments

    spec = {"rules_dir": "/r", "out_dir": "/o", "only": ["a", "b"]}
    args = release.backtest_args(spec, {"events.raw": "/e.jsonl", "context.raw": "/c.jsonl"}, "ts", "sink")
    import argparse

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    ns = parser.parse_args(args)
    assert ns.only == ["a", "b"] and ns.time_field == "ts" and ns.sink_topic == "sink"
    assert sorted(ns.input if isinstance(ns.input, list) else [ns.input]) == ["context.raw=/c.jsonl", "events.raw=/e.jsonl"]
