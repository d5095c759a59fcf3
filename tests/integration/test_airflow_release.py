"""The rule lifecycle on a real Airflow: PostgreSQL metadata DB, a real api-server (REST
API, UI, plugin), DAG runs executed with `airflow dags test`, the backtests on a real
Spark Connect server (`rulectl connect`, as `rulectl up` runs them; spark-submit is
test_backtest_on_cluster's), and a real broker's `rules.active`.

The tests share one rules repository and run in order: each commit builds on the
previous one, like a branch's history.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest
from airflow_fixtures import (  # noqa: F401
    ROOT,
    USERS,
    AirflowEnv,
    Chromium,
    airflow_env,
    chromium_available,
    png_size,
)

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]  # the release runs Spark backtests

# The approver guide's screenshots go to the test's tmp_path; RULES_SCREENSHOT_DIR=tests/screenshots
# refreshes the committed ones.
SCREENSHOT_DIR = os.environ.get("RULES_SCREENSHOT_DIR")
DEMO_RULES = ["rapid_clicks", "purchase_threshold", "fx_rate_deviation"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def commit_all(repo: Path, message: str, author: str = "Rita Author <rita@example.com>") -> str:
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=Rita Author", "-c", "user.email=rita@example.com", "commit", "-q", "-m", message, "--author", author)
    return git(repo, "rev-parse", "HEAD")


FORGED_SUBJECT = "rapid_clicks: 8 clicks **APPROVED BY SECURITY** <img src=x onerror=alert(1)> [docs](http://evil.example/x)"


def _hitl_path(detail: dict) -> str:
    from urllib.parse import quote

    ti = detail["task_instance"]
    return (
        f"/api/v2/dags/{ti['dag_id']}/dagRuns/{quote(ti['dag_run_id'], safe='')}"
        f"/taskInstances/{ti['task_id']}/{ti.get('map_index', -1)}/hitlDetails"
    )


def topic_records(bootstrap: str, topic: str) -> list:
    from spark_jobs.kafka.admin import read_all

    return read_all(bootstrap, topic, timeout=30)


class Release:
    """Shared state of the module: repo, settings Variable, broker topic."""

    def __init__(self, af: AirflowEnv, repo: Path, state: Path, bootstrap: str, topic: str, remote: str) -> None:
        self.af, self.repo, self.state, self.bootstrap, self.topic = af, repo, state, bootstrap, topic
        self.remote = remote  # the Spark Connect server the backtests run on

    @property
    def audit_dir(self) -> Path:
        return self.state / "audit"

    def live(self) -> dict[str, dict]:
        from spark_jobs.kafka.publisher import current_rules

        return current_rules(self.bootstrap, self.topic)


@pytest.fixture(scope="module")
def release(airflow_env: AirflowEnv, kafka_broker, connect_server, tmp_path_factory) -> Release:  # noqa: F811
    """A rules repo with the demo rules, published to a fresh topic (the state before the tests)."""
    from spark_jobs.kafka.publisher import publish_rules
    from spark_jobs.rules.loader import load_rules

    base = tmp_path_factory.mktemp("release")
    repo = base / "rules-repo"
    (repo / "rules").mkdir(parents=True)
    # A few demo rules of each kind keep the Spark backtests short on a 2-core machine.
    for name in DEMO_RULES:
        shutil.copy(ROOT / "rules" / f"{name}.yaml", repo / "rules" / f"{name}.yaml")
    git(repo, "init", "-q", "-b", "main")
    c0 = commit_all(repo, "Initial rule set")
    topic = f"rules.active.{uuid.uuid4().hex[:8]}"
    loaded = load_rules([repo / "rules"])
    assert not loaded.errors, loaded.errors
    publish_rules([lr.rule for lr in loaded.rules], kafka_broker.bootstrap, topic, published_by="bootstrap", commit=c0)
    state = base / "state"
    settings = {
        "repo": str(repo),
        "branch": "main",
        "state_dir": str(state),
        "bootstrap": kafka_broker.bootstrap,
        "rules_topic": topic,
        "spark_remote": connect_server,
        "history_inputs": {
            "events.raw": str(ROOT / "tests" / "data" / "demo" / "events.raw.jsonl"),
            "context.raw": str(ROOT / "tests" / "data" / "demo" / "context.raw.jsonl"),
        },
    }
    # The way an operator configures it: an Airflow Variable, through the REST API.
    airflow_env.api("POST", "/variables", {"key": "rule_lifecycle", "value": json.dumps(settings)})
    return Release(airflow_env, repo, state, kafka_broker.bootstrap, topic, connect_server)


def test_dags_import_without_errors(airflow_env: AirflowEnv) -> None:  # noqa: F811
    script = (
        "import json\n"
        "from airflow.dag_processing.dagbag import DagBag\n"
        "from airflow import plugins_manager\n"
        "bag = DagBag()\n"
        "plugins_manager.ensure_plugins_loaded()\n"
        "print(json.dumps({'errors': {k: str(v) for k, v in bag.import_errors.items()},\n"
        "  'dags': {d.dag_id: sorted(t.task_id for t in d.tasks) for d in bag.dags.values()},\n"
        "  'plugin_errors': plugins_manager.get_import_errors(),\n"
        "  'plugins': [p['name'] for p in plugins_manager.get_plugin_info()]}))\n"
    )
    proc = subprocess.run(
        [str(Path(airflow_env.env["PATH"].split(":")[0]) / "python"), "-c", script],
        env=airflow_env.env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["errors"] == {}
    assert out["plugin_errors"] == {}
    assert "rule_lifecycle" in out["plugins"]
    assert {"rule_release", "backtest_report"} <= set(out["dags"])
    assert {"validate_rules", "backtest_candidate", "approve", "publish"} <= set(out["dags"]["rule_release"])


def _approval_url(af: AirflowEnv, detail: dict) -> str:
    from urllib.parse import quote

    ti = detail["task_instance"]
    return f"{af.base_url}/dags/{ti['dag_id']}/runs/{quote(ti['dag_run_id'], safe='')}/tasks/{ti['task_id']}/required_actions"


def _pending(af: AirflowEnv, detail: dict) -> bool:
    ti = detail["task_instance"]
    details = af.api("GET", f"/dags/{ti['dag_id']}/dagRuns/{ti['dag_run_id']}/hitlDetails")["hitl_details"]
    return not [d for d in details if d["task_instance"]["task_id"] == ti["task_id"]][0]["response_received"]


def _try_to_approve_in_the_browser(
    browser: Chromium, af: AirflowEnv, detail: dict, user: str, expect: str | None = None
) -> str:
    """Log in as `user`, open the approval, click Approve; returns the page text after
    (once it shows `expect`, when given: the refusal arrives as a toast that fades)."""
    browser.login(af.base_url, user, USERS[user])
    browser.goto(_approval_url(af, detail))
    browser.wait_for("document.body.innerText.includes('Open the backtest report')", timeout=60)
    time.sleep(1.0)
    clicked = browser.click_button("Approve")
    if clicked and expect is not None:
        try:
            return "[clicked] " + str(browser.wait_for(
                f"document.body.innerText.includes({json.dumps(expect)}) && document.body.innerText", timeout=20))
        except TimeoutError:
            pass  # the caller's assertion shows what the page said instead
    time.sleep(3.0)
    return ("[clicked] " if clicked else "[no Approve button] ") + browser.text()


def _shoot_approval_page(browser: Chromium, af: AirflowEnv, detail: dict, out: Path) -> None:
    """Screenshots for the approver guide: the Required Actions page and the report tab."""
    ti = detail["task_instance"]
    from urllib.parse import quote

    run = quote(ti["dag_run_id"], safe="")
    browser.goto(_approval_url(af, detail))
    browser.wait_for("document.body.innerText.includes('Open the backtest report')", timeout=60)
    time.sleep(1.5)
    out.mkdir(parents=True, exist_ok=True)
    assert png_size(browser.screenshot(out / "approval_page.png", full_page=False)) == (1400, 1100)
    browser.goto(f"{af.base_url}/dags/{ti['dag_id']}/runs/{run}/plugin/backtest-report")
    time.sleep(4)
    assert png_size(browser.screenshot(out / "report_tab.png", full_page=False)) == (1400, 1100)


def test_release_waits_for_approval_then_publishes_exactly_the_changed_rule(release: Release, tmp_path: Path) -> None:
    af = release.af
    before = len(topic_records(release.bootstrap, release.topic))
    live_before = release.live()
    assert live_before["rapid_clicks"]["version"] == "1"

    text = (release.repo / "rules" / "rapid_clicks.yaml").read_text()
    text = text.replace('version: "1"', 'version: "2"').replace("threshold: 10", "threshold: 8")
    (release.repo / "rules" / "rapid_clicks.yaml").write_text(text)
    # Carol holds the approver role and wrote this change: four eyes keep her from approving
    # it. Her subject line tries to forge the approval page.
    c1 = commit_all(release.repo, FORGED_SUBJECT, author="Carol Approver <carol@example.com>")

    # No commit given: the sensor finds the new head of the tracked branch.
    run = af.start_dag_test("rule_release", log_name="release-approve")
    detail = af.wait_for_hitl("rule_release", run)
    run_id = detail["task_instance"]["dag_run_id"]
    assert "Rule diff:** `rapid_clicks`" in detail["body"] and "```diff" in detail["body"]
    assert "-threshold: 10" in detail["body"] and "+threshold: 8" in detail["body"]
    assert "/rule-reports/dags/rule_release/runs/" in detail["body"]
    assert "Four eyes" in detail["body"] and "`Carol Approver <carol@example.com>`" in detail["body"]
    # The step is assigned to the approver role (the platform's auth manager honours it).
    assert detail["assigned_users"] == [{"id": "role:Rule approver", "name": "Rule approvers"}]
    states = af.task_states("rule_release", run_id)
    assert states["backtest_candidate"] == "success" and states["backtest_published"] == "success"
    assert states["publish"] is None  # nothing published while waiting
    # Both backtests ran as clients of the warm server, in their tasks: no spark-submit,
    # no JVM of their own (`airflow dags test` runs tasks in-process: their logs are its output).
    said = run.output()
    assert said.count(f"Backtest on the Spark Connect server {release.remote}") == 2, said[-4000:]
    assert "Spark-Submit cmd" not in said, said[-4000:]
    # The approvers were notified (embedded default: a private JSON Lines file).
    notes = release.state / "notifications" / "approvals.jsonl"
    assert notes.stat().st_mode & 0o777 == 0o600
    note = json.loads(notes.read_text().splitlines()[-1])
    assert note["run_id"] == run_id and note["commit"] == c1 and note["rules"] == ["rapid_clicks"]
    assert note["approve_url"].endswith("/tasks/approve/required_actions") and "carol@example.com" in note["authors"]

    # The report, served by the plugin inside the api-server, to a logged-in user only.
    status, html = af.request("GET", f"/rule-reports/dags/rule_release/runs/{run_id}/")
    assert status == 200 and b"rapid_clicks" in html and b'id="added-removed"' in html
    status, raw = af.request("GET", f"/rule-reports/dags/rule_release/runs/{run_id}/report.json")
    report = json.loads(raw)
    assert [r["rule_id"] for r in report["rules"]] == ["rapid_clicks"]
    assert report["rules"][0]["published_version"] == "1" and report["rules"][0]["candidate_version"] == "2"
    status, _ = af.request("GET", f"/rule-reports/dags/rule_release/runs/{run_id}/data_docs/index.html")
    assert status == 200
    with pytest.raises(urllib.error.HTTPError, match="401|403"):
        urllib.request.urlopen(f"{af.base_url}/rule-reports/dags/rule_release/runs/{run_id}/", timeout=30)

    # Four eyes through the API: the author (an approver) is refused, and told why; a
    # viewer and an operator may not answer at all.
    status, body = af.request("PATCH", _hitl_path(detail), {"chosen_options": ["Approve"], "params_input": {}}, "carol")
    assert status == 403 and b"Four eyes" in body and b"carol@example.com" in body, body
    for user in ("bob", "oscar", "rita"):
        status, body = af.request("PATCH", _hitl_path(detail), {"chosen_options": ["Approve"], "params_input": {}}, user)
        assert status == 403, (user, body)
    assert _pending(af, detail)

    if chromium_available():
        with Chromium(width=1400, height=1100) as browser:
            # The approval page shows the forged subject as text, not as markup.
            browser.login(af.base_url, "bob", USERS["bob"])
            browser.goto(_approval_url(af, detail))
            browser.wait_for("document.body.innerText.includes('Open the backtest report')", timeout=60)
            page = browser.text()
            assert "**APPROVED BY SECURITY**" in page and "<img src=x onerror=alert(1)>" in page, page[-3000:]
            links = browser.evaluate("JSON.stringify([...document.querySelectorAll('a')].map(a => a.href))")
            assert "evil.example" not in str(links)
            assert browser.evaluate("document.querySelectorAll('img[src=\"x\"]').length") == 0
            # A viewer reads the report but cannot approve.
            browser.goto(f"{af.base_url}/rule-reports/dags/rule_release/runs/{run_id}/")
            assert "rapid_clicks" in browser.text()
            # Airflow offers him the button all the same; his click is refused, and he
            # reads why (the approval body's own "Four eyes" paragraph does not count).
            bob_reason = "Four eyes: bob does not hold an approver role"
            said = _try_to_approve_in_the_browser(browser, af, detail, "bob", expect=bob_reason)
            assert _pending(af, detail), said[:300]
            assert said.startswith("[clicked]") and bob_reason in said, said[-2000:]
            assert "only approvers decide a release" in said and "Access Denied" not in said, said[-2000:]
            # The author, an approver, clicks Approve and is refused, with the reason.
            carol_reason = "Four eyes: carol <carol@example.com> authored or committed"
            said = _try_to_approve_in_the_browser(browser, af, detail, "carol", expect=carol_reason)
            assert _pending(af, detail)
            assert said.startswith("[clicked]") and carol_reason in said, said[-2000:]
            assert "another approver must decide it" in said and "Access Denied" not in said, said[-2000:]
            # Alice, an approver who wrote none of it, approves.
            said = _try_to_approve_in_the_browser(browser, af, detail, "alice")
            assert said.startswith("[clicked]"), said[-2000:]
            deadline = time.monotonic() + 60
            while _pending(af, detail) and time.monotonic() < deadline:
                time.sleep(1)
            _shoot_approval_page(browser, af, detail, Path(SCREENSHOT_DIR) if SCREENSHOT_DIR else tmp_path)
    else:  # pragma: no cover - CI installs Chromium
        af.respond(detail, "Approve", comment="threshold 8 catches the bot farm")
    assert not _pending(af, detail)
    ti = detail["task_instance"]
    answered = [d for d in af.api("GET", f"/dags/rule_release/dagRuns/{ti['dag_run_id']}/hitlDetails")["hitl_details"]]
    assert answered[0]["responded_by_user"]["name"] == "alice" and answered[0]["chosen_options"] == ["Approve"]
    rc = run.wait()
    dag_run = af.dag_run("rule_release", run_id)
    assert dag_run["state"] == "success", run.output()[-5000:]
    assert rc == 0

    records = topic_records(release.bootstrap, release.topic)
    assert len(records) == before + 1  # exactly one record: the changed rule
    assert records[-1].key == b"rapid_clicks"
    live = release.live()
    assert live["rapid_clicks"]["version"] == "2" and live["rapid_clicks"]["threshold"] == 8
    assert {k: v for k, v in live.items() if k != "rapid_clicks"} == {
        k: v for k, v in live_before.items() if k != "rapid_clicks"
    }

    # Audit: who approved version 2 of rapid_clicks.
    from spark_jobs.cli import main as rulectl

    out = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "rulectl") if (ROOT / ".venv" / "bin" / "rulectl").exists() else "rulectl",
         "history", "rapid_clicks", "--audit-dir", str(release.audit_dir), "--format", "json"],
        capture_output=True, text=True,
    )
    rows = json.loads(out.stdout)
    pub = [r for r in rows if r["event"] == "published"]
    assert pub and pub[-1]["version"] == "2" and pub[-1]["by"] == "alice" and pub[-1]["commit"] == c1
    assert pub[-1]["previous_version"] == "1" and pub[-1]["produced"] is True
    # The audit answers who, when, which commit and versions, on which evidence, and who could not approve.
    assert pub[-1]["at"] and pub[-1]["report_sha256"] and "carol@example.com" in pub[-1]["authors"]
    import hashlib

    served = af.request("GET", f"/rule-reports/dags/rule_release/runs/{run_id}/")[1]
    assert hashlib.sha256(served).hexdigest() == pub[-1]["report_sha256"]
    assert rulectl(["history", "rapid_clicks", "--audit-dir", str(release.audit_dir)]) == 0

    # A second run on the same commit publishes nothing new.
    again = af.start_dag_test("rule_release", conf={"commit": c1}, log_name="release-again")
    assert again.wait() == 0, again.output()[-4000:]
    second = af.latest_run("rule_release")
    assert second["dag_run_id"] != run_id and second["state"] == "success"
    assert af.task_states("rule_release", second["dag_run_id"])["approve"] == "skipped"
    assert len(topic_records(release.bootstrap, release.topic)) == before + 1
    from spark_jobs.lifecycle.audit import read_records

    assert read_records(release.audit_dir)[-1]["event"] == "no_change"


def test_invalid_commit_stops_at_validation(release: Release) -> None:
    af = release.af
    before = len(topic_records(release.bootstrap, release.topic))
    path = release.repo / "rules" / "rapid_clicks.yaml"
    path.write_text(path.read_text().replace('version: "2"', 'version: "3"').replace("window_unit: seconds", "window_unit: weeks"))
    commit_all(release.repo, "rapid_clicks: weekly window (typo)")

    run = af.start_dag_test("rule_release", log_name="release-invalid")
    run.wait()
    dag_run = af.latest_run("rule_release")
    assert dag_run["state"] == "failed"
    states = af.task_states("rule_release", dag_run["dag_run_id"])
    assert states["validate_rules"] == "failed"
    assert states["backtest_candidate"] in ("upstream_failed", None)
    assert states["publish"] in ("upstream_failed", None)
    # `airflow dags test` runs tasks in-process: their logs are its output.
    log = run.output()
    assert "INVALID RULE rules/rapid_clicks.yaml: field 'window_unit': Input should be 'seconds'" in log, log[-3000:]
    assert len(topic_records(release.bootstrap, release.topic)) == before
    from spark_jobs.lifecycle.audit import read_records

    assert read_records(release.audit_dir)[-1]["event"] == "invalid"


def test_rejected_release_publishes_nothing(release: Release) -> None:
    af = release.af
    before = len(topic_records(release.bootstrap, release.topic))
    path = release.repo / "rules" / "rapid_clicks.yaml"
    git(release.repo, "checkout", "HEAD~1", "--", "rules/rapid_clicks.yaml")  # undo the typo
    (release.repo / "rules" / "big_view.yaml").write_text(
        "rule_id: big_view\nversion: \"1\"\nrule_type: threshold\nname: Big views\nsource_topic: events.raw\n"
        "conditions:\n  - {field: type, operator: \"==\", value: view}\n  - {field: value, operator: \">=\", value: 50}\n"
    )
    assert "window_unit: seconds" in path.read_text()
    commit_all(release.repo, "Add big_view")

    run = af.start_dag_test("rule_release", log_name="release-reject")
    detail = af.wait_for_hitl("rule_release", run)
    run_id = detail["task_instance"]["dag_run_id"]
    assert "Rule diff:** `big_view`" in detail["body"]
    states = af.task_states("rule_release", run_id)
    assert states["backtest_published"] == "skipped"  # a new rule: nothing live to compare
    af.respond(detail, "Reject", comment="too noisy on checkout pages")
    assert run.wait() == 0
    dag_run = af.dag_run("rule_release", run_id)
    assert dag_run["state"] == "success"
    states = af.task_states("rule_release", run_id)
    assert states["publish"] == "skipped" and states["record_outcome"] == "success"
    said = af.xcom("rule_release", run_id, "record_outcome")
    assert "Rejected by alice" in said and "too noisy on checkout pages" in said
    assert "Rejected by alice" in run.output()
    assert len(topic_records(release.bootstrap, release.topic)) == before
    assert "big_view" not in release.live()
    from spark_jobs.lifecycle.audit import read_records

    last = read_records(release.audit_dir)[-1]
    assert last["event"] == "rejected" and last["decided_by"]["name"] == "alice"
    # It reads as rejected at a glance: the run's note (the grid marks it, the run page
    # shows it), not just green. Set by the task through the release service's account,
    # so it is read back here from Airflow itself: the run and the runs list.
    note = af.dag_run("rule_release", run_id).get("note") or ""
    assert note.startswith("REJECTED: Rejected by alice") and "too noisy on checkout pages" in note, note
    listed = {r["dag_run_id"]: r for r in af.api("GET", "/dags/rule_release/dagRuns?limit=100")["dag_runs"]}
    assert (listed[run_id].get("note") or "").startswith("REJECTED: "), listed[run_id]
    # ... and `rulectl history` of the rejected rule says so.
    from spark_jobs.lifecycle.audit import rule_history

    assert [r["event"] for r in rule_history(read_records(release.audit_dir), "big_view")] == ["rejected"]


def _set_threshold(repo: Path, version: str, threshold: int) -> None:
    import re

    path = repo / "rules" / "rapid_clicks.yaml"
    text = re.sub(r'version: "\d+"', f'version: "{version}"', path.read_text())
    path.write_text(re.sub(r"threshold: \d+", f"threshold: {threshold}", text))


def test_a_newer_commit_supersedes_a_pending_release(release: Release) -> None:
    """A hotfix does not wait for last week's approval: the newer commit's run ends the
    pending older one (failed, with a note; `superseded` in the audit), and only the
    newer one publishes."""
    af = release.af
    from spark_jobs.lifecycle.audit import read_records

    before = len(topic_records(release.bootstrap, release.topic))
    _set_threshold(release.repo, "3", 7)
    old_commit = commit_all(release.repo, "rapid_clicks: 7 clicks")
    first = af.start_dag_test("rule_release", log_name="release-superseded")
    first_detail = af.wait_for_hitl("rule_release", first)
    first_run = first_detail["task_instance"]["dag_run_id"]

    _set_threshold(release.repo, "4", 6)
    new_commit = commit_all(release.repo, "rapid_clicks: hotfix, 6 clicks")
    second = af.start_dag_test("rule_release", log_name="release-hotfix")
    deadline = time.monotonic() + 400
    second_detail = None
    while time.monotonic() < deadline and second_detail is None:
        pending = af.api("GET", "/dags/rule_release/dagRuns/~/hitlDetails?response_received=false")["hitl_details"]
        second_detail = next((d for d in pending if d["task_instance"]["dag_run_id"] != first_run), None)
        time.sleep(2)
    assert second_detail is not None, second.output()[-4000:]
    second_run = second_detail["task_instance"]["dag_run_id"]

    # The older run is over: failed, and its note says why, in the UI's run list.
    old = af.dag_run("rule_release", first_run)
    assert old["state"] == "failed" and "Superseded by" in (old.get("note") or ""), old
    first.wait(timeout=120)
    old_states = af.task_states("rule_release", first_run)
    assert old_states["publish"] != "success" and old_states["approve"] not in ("success", "awaiting_input"), old_states
    superseded = [r for r in read_records(release.audit_dir) if r["event"] == "superseded"]
    assert superseded and superseded[-1]["commit"] == old_commit and superseded[-1]["run_id"] == first_run
    assert superseded[-1]["superseded_by"]["commit"] == new_commit

    af.respond(second_detail, "Approve", comment="hotfix")
    assert second.wait() == 0, second.output()[-4000:]
    assert af.dag_run("rule_release", second_run)["state"] == "success"
    records = topic_records(release.bootstrap, release.topic)
    versions = [json.loads(r.value)["version"] for r in records[before:] if r.key == b"rapid_clicks"]
    assert versions == ["4"]  # the hotfix published; version 3 never was
    assert release.live()["rapid_clicks"]["threshold"] == 6


def test_scheduled_backtest_report_keeps_a_dated_report(release: Release) -> None:
    af = release.af
    run = af.start_dag_test("backtest_report", log_name="backtest-report")
    assert run.wait() == 0, run.output()[-5000:]
    assert f"Backtest on the Spark Connect server {release.remote}" in run.output(), run.output()[-4000:]
    dag_run = af.latest_run("backtest_report")
    assert dag_run["state"] == "success", run.output()[-5000:]
    run_id = dag_run["dag_run_id"]
    dated = sorted((release.state / "reports" / "backtest_report").iterdir())
    assert len(dated) == 1 and dated[0].name == dag_run["logical_date"][:10]
    doc = json.loads((dated[0] / "report.json").read_text())
    assert doc["kind"] == "scheduled"
    live = release.live()
    assert {r["rule_id"] for r in doc["rules"]} == {k for k, v in live.items() if v.get("enabled", True)}
    versions = {r["rule_id"]: r["candidate_version"] for r in doc["rules"]}
    assert versions["rapid_clicks"] == "4"  # the published version
    assert doc["quality"]["topics"]["events.raw"]["records"] > 0
    assert (dated[0] / "data_docs" / "index.html").exists()
    status, html = af.request("GET", f"/rule-reports/dags/backtest_report/runs/{run_id}/")
    assert status == 200 and b"Daily backtest of the published rules" in html
