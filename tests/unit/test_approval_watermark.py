"""Issue 36, item 7, without Airflow: the approval page says when approving restarts the
live detection job (a release that changes the job's watermark delay) and that
detections pause meanwhile, naming the rules; and says nothing of the kind when the
job's watermark stays.

The oracle is the requirement, on the demo rule files: the job runs with the largest
watermark delay of its enabled event-time rules (rapid_clicks has 5 s, as do the other
event-time demo rules by default), so raising rapid_clicks' delay moves it, and
lowering a rule's delay below another's does not.
"""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from spark_jobs.lifecycle import release
from spark_jobs.rules.model import parse_rule, rule_to_json_dict

ROOT = Path(__file__).resolve().parents[2]
DEMO = ["rapid_clicks", "global_burst", "purchase_sum_per_user", "purchase_threshold"]


def _doc(name: str, **changes: object) -> dict:
    raw = yaml.safe_load((ROOT / "rules" / f"{name}.yaml").read_text())
    raw.update(changes)
    return rule_to_json_dict(parse_rule(raw))


def _live() -> dict[str, dict]:
    return {name: _doc(name) for name in DEMO}


def _body(live: dict, candidate: dict, changed: list[str]) -> str:
    rules = [{"rule_id": rid, "published_version": (live.get(rid) or {}).get("version"),
              "candidate_version": candidate[rid]["version"], "diff": ""} for rid in changed]
    report = {"context": {"commit": "a" * 40, "author": "Rita", "commit_subject": "s", "base_commit": "b" * 40},
              "rules": rules, "watermark": release.watermark_change(live, candidate, changed)}
    return release.approval_body(report, "/rule-reports/dags/rule_release/runs/r1/", "rules.active")


def _says_restart(body: str) -> bool:
    return "restarts the live detection job" in body


def test_a_release_that_moves_the_job_watermark_says_the_job_restarts_and_detections_pause() -> None:
    live = _live()
    candidate = {**live, "rapid_clicks": _doc("rapid_clicks", version="9", watermark_delay=120)}
    body = _body(live, candidate, ["rapid_clicks"])
    assert _says_restart(body), body
    assert "`rapid_clicks` (5s → 120s)" in body and "from 5s to 120s" in body
    assert "Detections pause while the job restarts" in body
    # Where to see that it is back, and no duration the repository cannot back.
    assert "`running`" in body and "detect.status" in body
    assert not re.search(r"\b(within|about|takes?|minutes?|seconds)\b", body), body


def test_a_new_event_time_rule_with_a_larger_delay_is_named() -> None:
    live = _live()
    new = _doc("rapid_clicks", rule_id="slow_clicks", version="1", watermark_delay=60)
    body = _body(live, {**live, "slow_clicks": new}, ["slow_clicks"])
    assert _says_restart(body) and "`slow_clicks` (none → 60s)" in body, body


def test_a_change_that_leaves_the_watermark_alone_says_nothing_of_a_restart() -> None:
    live = _live()
    candidate = {**live, "rapid_clicks": _doc("rapid_clicks", version="9", threshold=8)}
    body = _body(live, candidate, ["rapid_clicks"])
    assert "watermark" not in body.lower() and "restart" not in body.lower(), body


def test_a_rule_delay_below_the_job_watermark_keeps_the_job_running() -> None:
    live = {**_live(), "global_burst": _doc("global_burst", watermark_delay=60)}
    candidate = {**live, "rapid_clicks": _doc("rapid_clicks", version="9", watermark_delay=30)}
    body = _body(live, candidate, ["rapid_clicks"])
    assert not _says_restart(body), body
    assert "`rapid_clicks` (5s → 30s)" in body and "stays 60s" in body and "keeps running" in body
