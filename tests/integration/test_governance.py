"""Issue 13 on a real Airflow (PostgreSQL, api-server, plugin) and a real Chromium:
the report view serves only the folder it derives itself, with a strict CSP, and
trigger params outside the allow-list are refused before a run exists.

No Spark here: the runs are created through the REST API (no scheduler runs them) and
the report folder is written by the test, which is all the view needs.
"""

from __future__ import annotations

import json
import urllib.parse

import pytest
from airflow_fixtures import AirflowEnv, Chromium, airflow_env, chromium_available  # noqa: F401

pytestmark = [pytest.mark.airflow]

RUN_ID = "gov-run-1"


@pytest.fixture(scope="module")
def gov(airflow_env: AirflowEnv, tmp_path_factory):  # noqa: F811
    """The DAGs serialized (as the dag-processor would) and the operator's settings."""
    proc = airflow_env.cli("dags", "reserialize")
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = tmp_path_factory.mktemp("gov-state")
    airflow_env.api("POST", "/variables", {"key": "rule_lifecycle", "value": json.dumps({"state_dir": str(state)})})
    yield airflow_env, state
    airflow_env.request("DELETE", "/api/v2/variables/rule_lifecycle")


def _runs(af: AirflowEnv, dag_id: str) -> list[str]:
    return [r["dag_run_id"] for r in af.api("GET", f"/dags/{dag_id}/dagRuns?limit=100")["dag_runs"]]


@pytest.mark.parametrize(
    ("dag_id", "conf"),
    [
        ("rule_release", {"settings": {"spark_conf": {"spark.pyspark.python": "/bin/sh"}}}),
        ("rule_release", {"settings": {"history_inputs": {"events.raw": "/etc/passwd"}}}),
        ("rule_release", {"settings": {"history_inputs": {"events.raw": "../../etc/passwd"}}}),
        ("rule_release", {"commit": "--upload-pack=touch /tmp/pwned"}),
        ("backtest_report", {"settings": {"spark_conf": {"spark.driver.extraJavaOptions": "-Dx=1"}}}),
        ("backtest_report", {"settings": {"history_inputs": {"events.raw": "/etc/passwd"}}}),
        # Undeclared top-level keys: Airflow's own Param check lets these through.
        ("rule_release", {"spark_conf": {"spark.pyspark.python": "/bin/sh"}}),
        ("rule_release", {"commit": "0123abcd", "history_root": "/"}),
        ("backtest_report", {"spark_conf": {"spark.driver.extraJavaOptions": "-Dx=1"}}),
    ],
)
def test_params_outside_the_allow_list_are_refused_at_trigger(gov, dag_id: str, conf: dict) -> None:
    af, _ = gov
    before = _runs(af, dag_id)
    status, body = af.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", {"logical_date": None, "conf": conf})
    assert status == 400, body[:500]
    assert _runs(af, dag_id) == before  # no run, so no task ran
    # The refusal names the offending key (the last one given, or the first of `settings`).
    key = list(conf)[-1]
    if key == "settings":
        key = next(iter(conf["settings"]))
    assert key.encode() in body, body[:500]


def test_a_backfill_with_params_outside_the_allow_list_is_refused(gov) -> None:
    """A backfill creates runs with its `dag_run_conf`: the same allow-list applies."""
    af, _ = gov
    before = _runs(af, "rule_release")
    body = {"dag_id": "rule_release", "from_date": "2026-01-02T00:00:00Z", "to_date": "2026-01-02T00:10:00Z",
            "dag_run_conf": {"spark_conf": {"spark.pyspark.python": "/bin/sh"}}}
    for path in ("/api/v2/backfills/dry_run", "/api/v2/backfills"):
        status, raw = af.request("POST", path, body)
        assert status == 400 and b"spark_conf" in raw, (path, status, raw[:500])
    assert _runs(af, "rule_release") == before


def test_a_run_created_with_refused_params_fails_loudly(gov) -> None:
    """`airflow dags test -c` creates the run without the api-server: the first task
    refuses the params and the run fails (not a soft-fail skip that reads as "nothing new")."""
    af, _ = gov
    conf = {"spark_conf": {"spark.pyspark.python": "/bin/sh"}}
    run = af.start_dag_test("rule_release", conf=conf, log_name="refused-params")
    run.wait(timeout=300)
    dag_run = next(r for r in af.api("GET", "/dags/rule_release/dagRuns?order_by=-run_after&limit=20")["dag_runs"]
                   if r.get("conf") == conf)
    states = af.task_states("rule_release", dag_run["dag_run_id"])
    assert states["detect_commit"] == "failed", (states, run.output()[-3000:])
    assert dag_run["state"] == "failed", dag_run
    assert "refused trigger params: spark_conf" in run.output(), run.output()[-3000:]
    assert "soft_fail" not in run.output()


def test_allowed_params_are_accepted(gov) -> None:
    af, _ = gov
    conf = {"commit": "0123abcd", "settings": {"history_inputs": {"events.raw": "events.raw.jsonl"}, "history_lookback_hours": 6}}
    status, body = af.request("POST", "/api/v2/dags/rule_release/dagRuns", {"logical_date": None, "conf": conf})
    assert status == 200, body[:500]


@pytest.fixture(scope="module")
def run_with_evil_xcom(gov):
    """A release run whose `rule_report` XCom points at /etc (anyone who can write XComs can do this)."""
    af, state = gov
    status, body = af.request(
        "POST", "/api/v2/dags/rule_release/dagRuns", {"dag_run_id": RUN_ID, "logical_date": None, "conf": {}}
    )
    assert status == 200, body[:500]
    xcom_path = f"/dags/rule_release/dagRuns/{RUN_ID}/taskInstances/build_report/xcomEntries"
    af.api("POST", xcom_path, {"key": "rule_report", "value": {"dir": "/etc", "html": "/etc/passwd"}})
    return af, state


@pytest.fixture(scope="module")
def planted_report(run_with_evil_xcom):
    """The folder the server derives, <state_dir>/reports/<dag_id>/<run_id>, with a
    report that tries to run a script and a symlink out of the folder."""
    af, state = run_with_evil_xcom
    folder = state / "reports" / "rule_release" / RUN_ID
    (folder / "data_docs").mkdir(parents=True)
    (folder / "report.html").write_text(
        "<!DOCTYPE html><html><head><title>report</title></head><body><h1 id='h'>Release report</h1>"
        "<script>document.title = 'pwned'; document.getElementById('h').textContent = 'pwned';</script>"
        "</body></html>"
    )
    (folder / "data_docs" / "index.html").write_text("<html><body>docs</body></html>")
    (folder / "etc").symlink_to("/etc")
    return af


def _report_path(run_id: str = RUN_ID, rel: str = "") -> str:
    return f"/rule-reports/dags/rule_release/runs/{urllib.parse.quote(run_id, safe='')}/{rel}"


def test_report_view_ignores_an_xcom_pointing_at_etc(run_with_evil_xcom) -> None:
    af, _ = run_with_evil_xcom
    # The view derives the folder itself, and there is none yet: nothing is served.
    for rel in ("", "passwd", "hostname", "../../../../etc/passwd"):
        status, body = af.request("GET", _report_path(rel=rel))
        assert status == 404, (rel, body[:300])
        assert b"root:" not in body


def test_report_view_serves_only_its_own_folder(planted_report: AirflowEnv) -> None:
    af = planted_report
    status, body = af.request("GET", _report_path())
    assert status == 200 and b"Release report" in body
    status, body = af.request("GET", _report_path(rel="data_docs/index.html"))
    assert status == 200 and b"docs" in body
    for rel in ("etc/passwd", "passwd", "..%2F..%2F..%2Fetc%2Fpasswd"):
        status, body = af.request("GET", _report_path(rel=rel))
        assert status == 404 and b"root:" not in body, rel


def test_report_view_answers_404_to_a_nul_byte(planted_report: AirflowEnv) -> None:
    """`%00` names no file: a 404, not a 500 (the OS calls raise on a NUL byte, and
    PostgreSQL refuses one in a query)."""
    af = planted_report
    for path in (
        _report_path(rel="report.html%00.json"),
        _report_path(rel="%00"),
        _report_path(rel="data_docs/index.html%00"),
        "/rule-reports/dags/rule_release/runs/gov-run-1%00/",
        "/rule-reports/dags/rule_release/runs/gov-run-1%00/report.json",
    ):
        status, body = af.request("GET", path)
        assert status == 404, (path, status, body[:300])


def _csp(af: AirflowEnv, path: str) -> tuple[int, str]:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(f"{af.base_url}{path}", headers={"Authorization": f"Bearer {af.token()}"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.headers.get("Content-Security-Policy", "")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers.get("Content-Security-Policy", "")


def test_every_served_page_carries_a_strict_csp(planted_report: AirflowEnv) -> None:
    af = planted_report
    for path, want in [
        (_report_path(), 200),
        (_report_path(rel="data_docs/index.html"), 200),
        (_report_path(rel="missing.html"), 404),
        ("/rule-reports/", 200),
        ("/rule-reports/dags/rule_release/runs/nope/", 404),
    ]:
        status, csp = _csp(af, path)
        assert status == want, path
        directives = {d.strip().split(" ")[0]: d.strip() for d in csp.split(";") if d.strip()}
        assert directives.get("default-src") == "default-src 'none'", (path, csp)
        assert directives.get("script-src") == "script-src 'none'", (path, csp)
        assert "http" not in csp and "*" not in csp, (path, csp)


@pytest.mark.skipif(not chromium_available(), reason="headless Chromium not installed")
def test_a_script_in_a_served_report_does_not_run_in_the_browser(planted_report: AirflowEnv) -> None:
    af = planted_report
    with Chromium() as browser:
        browser.set_cookie(af.base_url, "_token", af.token())
        browser.goto(f"{af.base_url}{_report_path()}")
        browser.wait_for("document.readyState === 'complete'")
        assert browser.evaluate("document.getElementById('h').textContent") == "Release report"
        assert browser.evaluate("document.title") == "report"


@pytest.mark.skipif(not chromium_available(), reason="headless Chromium not installed")
def test_a_viewer_reads_the_report_in_the_runs_backtest_report_tab(planted_report: AirflowEnv) -> None:
    """Logged in as a Rule viewer, the run page has the plugin's tab, and the report
    loads inside it (same-origin frame, allowed by the CSP's frame-ancestors 'self')."""
    from airflow_fixtures import USERS

    af = planted_report
    with Chromium() as browser:
        browser.login(af.base_url, "bob", USERS["bob"])
        browser.goto(f"{af.base_url}/dags/rule_release/runs/{RUN_ID}")
        browser.wait_for("document.body.innerText.includes('Backtest report')", timeout=60)
        browser.goto(f"{af.base_url}/dags/rule_release/runs/{RUN_ID}/plugin/backtest-report")
        browser.wait_for(
            "(() => { const f = document.querySelector('iframe'); return !!(f && f.contentDocument"
            " && f.contentDocument.body && f.contentDocument.body.innerText.includes('Release report')); })()",
            timeout=60,
        )


# ----------------------------------------------------------------------------- roles (rulectl up)


def _login(af: AirflowEnv, username: str, password: str) -> str:
    import urllib.request

    req = urllib.request.Request(
        f"{af.base_url}/auth/token",
        data=json.dumps({"username": username, "password": password}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())["access_token"]


def _status(af: AirflowEnv, token: str, method: str, path: str, body: object = None) -> int:
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        f"{af.base_url}{path}", method=method, data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_rulectl_up_provisions_one_demo_user_per_role_and_a_second_approver(gov, tmp_path) -> None:
    """What `rulectl up` does before Airflow starts (migrate, roles, demo users), on the
    fixture's real metadata DB; then each demo user logs in and can do what its role
    says, and no more."""
    import sys

    from spark_jobs.commands import up

    af, _ = gov
    from spark_jobs.platform.identity import DEMO_USERS, write_secret_file

    paths = up.Paths(tmp_path)
    users = up.demo_users(paths)
    assert paths.users_file.stat().st_mode & 0o777 == 0o600
    # The fixture's own release-service account (same DB) keeps its password.
    users = [u for u in users if u["username"] in DEMO_USERS]
    write_secret_file(paths.users_file, users)
    airflow_bin = str(__import__("pathlib").Path(sys.executable).parent / "airflow")
    up.prepare_airflow(dict(af.env), airflow_bin, paths.users_file, tmp_path / "init.log")
    tokens = {u["username"]: _login(af, u["username"], u["password"]) for u in users}
    run_body = {"logical_date": None, "conf": {}}
    can = {
        name: {
            "read runs": _status(af, tok, "GET", "/api/v2/dags/rule_release/dagRuns") == 200,
            "trigger": _status(af, tok, "POST", "/api/v2/dags/rule_release/dagRuns", run_body) == 200,
            "trigger other": _status(af, tok, "POST", "/api/v2/dags/backtest_report/dagRuns", run_body) == 200,
            "variables": _status(af, tok, "GET", "/api/v2/variables") == 200,
            "reports": _status(af, tok, "GET", "/rule-reports/") == 200,
        }
        for name, tok in tokens.items()
    }
    assert can == {
        "author": {"read runs": True, "trigger": True, "trigger other": False, "variables": False, "reports": True},
        "approver": {"read runs": True, "trigger": False, "trigger other": False, "variables": False, "reports": True},
        "reviewer": {"read runs": True, "trigger": False, "trigger other": False, "variables": False, "reports": True},
        "viewer": {"read runs": True, "trigger": False, "trigger other": False, "variables": False, "reports": True},
        "operator": {"read runs": True, "trigger": True, "trigger other": True, "variables": True, "reports": True},
    }
    # The old development defaults do not exist.
    for user, password in (("admin", "admin"), ("admin", "change-me")):
        with pytest.raises(Exception, match="401|403"):
            _login(af, user, password)


def test_a_four_eyes_refusal_reaches_a_browser_session_with_a_status_the_ui_prints(run_with_evil_xcom) -> None:
    """The UI (cookie session) drops the body of a 403 and shows "Access Denied"; it
    prints the body of a status its client does not name. So a refused answer to the
    release approval gets 403 on the API (bearer token) and UI_REFUSAL_STATUS in a
    browser session, with the same reason. (The rendering itself: the Chromium part of
    test_airflow_release.py.)"""
    import urllib.error
    import urllib.request

    af, _ = run_with_evil_xcom
    path = f"/api/v2/dags/rule_release/dagRuns/{RUN_ID}/taskInstances/approve/-1/hitlDetails"
    body = {"chosen_options": ["Approve"], "params_input": {}}
    status, raw = af.request("PATCH", path, body, user="bob")
    assert status == 403 and b"Four eyes: bob does not hold an approver role" in raw, (status, raw[:300])
    req = urllib.request.Request(
        f"{af.base_url}{path}", data=json.dumps(body).encode(), method="PATCH",
        headers={"Cookie": f"_token={af.token('bob')}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    assert status == 432, (status, raw[:300])
    assert json.loads(raw)["detail"].startswith("Four eyes: bob does not hold an approver role"), raw[:300]
