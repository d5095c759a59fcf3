"""The backtest report inside the Airflow UI: a FastAPI app mounted on the api-server.

A run's report folder is derived here, on the server, from the lifecycle settings
(environment + the `rule_lifecycle` Variable, as an operator set them) and the run's
identity in the metadata DB: `<report_dir>/<dag_id>/<run_id>` for a release,
`<report_dir>/backtest_report/<date>` for the daily report
(spark_jobs.lifecycle.release.report_key). It never comes from an XCom or the
request: whoever can write an XCom must not be able to make the api-server serve its
own secret key or `airflow.cfg`. Within the folder, a request path that resolves
outside it (`..`, symlinks) is a 404.

Every response carries a strict Content-Security-Policy (no scripts, nothing loaded
from another origin), so a value rendered into a report or into Great Expectations'
Data Docs cannot run in the approver's Airflow session. Access needs the same right
as reading the DAG run, checked by Airflow's auth manager from the UI session cookie
or a bearer token.
"""

from __future__ import annotations

import html
import mimetypes
from pathlib import Path

from fastapi import Depends, FastAPI, HTTPException, Request, Response
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

from spark_jobs.lifecycle.release import REPORT_URL_PREFIX, REPORT_XCOM_KEY, report_key, safe_name

try:  # the auth dependency exists only inside the api-server package
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import requires_access_dag

    _RUN_ACCESS = [Depends(requires_access_dag(method="GET", access_entity=DagAccessEntity.RUN))]
    _ANY_DAG_ACCESS = [Depends(requires_access_dag(method="GET"))]
except ImportError:  # pragma: no cover
    _RUN_ACCESS = []
    _ANY_DAG_ACCESS = []

app = FastAPI(title="Rule lifecycle reports", docs_url=None, redoc_url=None, openapi_url=None)

# No script runs, nothing comes from another origin; inline styles (the report's and
# Data Docs' <style>) and same-origin images are all a report needs. frame-ancestors
# 'self' keeps the "Backtest report" tab (an iframe of the Airflow UI) working.
CSP = (
    "default-src 'none'; script-src 'none'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "font-src 'self'; connect-src 'none'; object-src 'none'; base-uri 'none'; form-action 'none'; "
    "frame-ancestors 'self'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


@app.middleware("http")
async def security_headers(request: Request, call_next) -> Response:  # type: ignore[no-untyped-def]
    """The CSP and friends on every response of this app, errors and redirects included."""
    response = await call_next(request)
    for name, value in SECURITY_HEADERS.items():
        response.headers[name] = value
    return response


def _server_settings():  # type: ignore[no-untyped-def]
    """The lifecycle settings as the operator configured them (environment, then the
    `rule_lifecycle` Variable read from the metadata DB): nothing a run or a request chose."""
    import json

    from airflow.models.variable import Variable

    from spark_jobs.lifecycle.settings import VARIABLE_NAME, LifecycleSettings, env_settings

    merged = env_settings()
    raw = Variable.get(VARIABLE_NAME, default_var=None)
    if raw:
        value = json.loads(raw)
        if isinstance(value, dict):
            merged.update(value)
    return LifecycleSettings.from_dict(merged)


def _report_root(dag_id: str, run_id: str) -> Path:
    """The run's report folder, derived from the settings and the DagRun row."""
    if "\x00" in dag_id or "\x00" in run_id:  # no such run (and PostgreSQL refuses NUL in a query)
        raise HTTPException(404, "Not found")
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        run = session.scalars(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id)).first()
        if run is None:
            raise HTTPException(404, "Not found")
        key = report_key(dag_id, run_id, run.logical_date, run.data_interval_end, run.run_after)
    root = Path(_server_settings().report_dir) / safe_name(dag_id) / safe_name(key)
    if not root.is_dir():
        raise HTTPException(404, f"No backtest report for run {run_id!r} of {dag_id!r} (yet).")
    return root


def _safe_file(root: Path, rel: str) -> Path:
    """`rel` inside `root`, or a 404: a path that leaves the folder, does not exist or
    cannot name a file at all (a NUL byte, `%00` in the URL, makes the OS calls raise
    ValueError, which would be a 500)."""
    base = root.resolve()
    if "\x00" in rel:
        raise HTTPException(404, "Not found")
    try:
        target = (base / rel).resolve()
    except (OSError, ValueError):
        raise HTTPException(404, "Not found") from None
    if base != target and base not in target.parents:
        raise HTTPException(404, "Not found")
    if target.is_dir():
        target = target / "index.html"
    if not target.is_file():
        raise HTTPException(404, "Not found")
    return target


@app.get("/dags/{dag_id}/runs/{run_id}", dependencies=_RUN_ACCESS, include_in_schema=False)
def report_redirect(dag_id: str, run_id: str) -> RedirectResponse:
    # Relative links inside the report (Data Docs) need the trailing slash.
    from urllib.parse import quote

    return RedirectResponse(f"./{quote(run_id, safe='')}/", status_code=307)


@app.get("/dags/{dag_id}/runs/{run_id}/", dependencies=_RUN_ACCESS, response_class=FileResponse)
def report_html(dag_id: str, run_id: str) -> FileResponse:
    """The run's report.html."""
    return FileResponse(_safe_file(_report_root(dag_id, run_id), "report.html"), media_type="text/html")


@app.get("/dags/{dag_id}/runs/{run_id}/{path:path}", dependencies=_RUN_ACCESS)
def report_file(dag_id: str, run_id: str, path: str) -> FileResponse:
    """report.json, Data Docs pages and anything else written next to the report."""
    target = _safe_file(_report_root(dag_id, run_id), path)
    media = mimetypes.guess_type(target.name)[0] or "application/octet-stream"
    return FileResponse(target, media_type=media)


@app.get("/", dependencies=_ANY_DAG_ACCESS, response_class=HTMLResponse)
def index() -> HTMLResponse:
    """The latest reports of every DAG, newest first."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.scalars(
            select(XComModel).where(XComModel.key == REPORT_XCOM_KEY).order_by(XComModel.timestamp.desc()).limit(100)
        ).all()
        items = [(r.dag_id, r.run_id, r.timestamp, XComModel.deserialize_value(r)) for r in rows]
    lines = []
    for dag_id, run_id, ts, value in items:
        title = (value or {}).get("title") or (value or {}).get("subject") or run_id
        lines.append(
            f"<li><a href='dags/{html.escape(dag_id)}/runs/{html.escape(run_id)}/'>{html.escape(dag_id)} · "
            f"{html.escape(run_id)}</a> — {html.escape(str(title))} <small>({ts:%Y-%m-%d %H:%M} UTC)</small></li>"
        )
    body = "".join(lines) or "<li>No reports yet.</li>"
    return HTMLResponse(
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>Backtest reports</title>"
        "<style>body{font-family:sans-serif;margin:24px}li{margin:6px 0}</style></head>"
        f"<body><h1>Backtest reports</h1><ul>{body}</ul></body></html>"
    )


@app.get("/detections/", dependencies=_ANY_DAG_ACCESS, response_class=HTMLResponse)
def detections_index() -> HTMLResponse:
    """The newest detections on the sink, each a link to its evidence chain."""
    from spark_jobs.lifecycle.evidence import recent_detections
    from spark_jobs.report.evidence_page import list_page

    settings = _server_settings()
    return HTMLResponse(list_page(settings.sink_topic, recent_detections(settings.bootstrap, settings.sink_topic)))


@app.get("/detections/{detection_id}", dependencies=_ANY_DAG_ACCESS, response_class=HTMLResponse)
def detection_chain(detection_id: str) -> HTMLResponse:
    """The evidence chain of one detection (spark_jobs/lifecycle/evidence.py). The
    event is looked up in the archive on the platform's Spark Connect server; without
    one the page says so (a page view does not start a JVM in the api-server)."""
    from spark_jobs.lifecycle.evidence import DETECTION_ID, Sources, explain

    if not DETECTION_ID.match(detection_id):
        raise HTTPException(404, "Not a detection id")
    from spark_jobs.report.evidence_page import chain_page

    settings = _server_settings()
    spark = None
    url = settings.remote_url()
    if url:
        from spark_jobs.spark import remote_session

        spark = remote_session(url)
    try:
        chain = explain(detection_id, Sources.from_settings(settings), spark=spark)
    finally:
        if spark is not None:
            spark.stop()  # this client's session on the shared server, not the server
    return HTMLResponse(chain_page(chain.to_dict()))


@app.get("/shadows/", dependencies=_ANY_DAG_ACCESS, response_class=HTMLResponse)
def shadows_index() -> HTMLResponse:
    """The shadow versions on rules.active, each a link to its diff."""
    from spark_jobs.kafka.admin import read_all
    from spark_jobs.lifecycle.shadow import running_shadows
    from spark_jobs.report.evidence_page import shadows_page

    s = _server_settings()
    return HTMLResponse(shadows_page(running_shadows(read_all(s.bootstrap, s.rules_topic, timeout=60, role="reader"))))


@app.get("/shadows/{rule_id}", dependencies=_ANY_DAG_ACCESS, response_class=HTMLResponse)
def shadow_diff(rule_id: str) -> HTMLResponse:
    """A rule's shadow version against its version in force (spark_jobs/lifecycle/shadow.py)."""
    from spark_jobs.lifecycle.shadow import read_diff
    from spark_jobs.report.evidence_page import shadow_page
    from spark_jobs.rules.model import RULE_ID

    if len(rule_id) > 200 or not RULE_ID.match(rule_id):
        raise HTTPException(404, "Not a rule id")
    s = _server_settings()
    return HTMLResponse(shadow_page(read_diff(s.bootstrap, rule_id, s.sink_topic, s.shadow_topic, s.rules_topic).to_dict()))


def report_href_template() -> str:
    """External-view href: relative (no leading slash) so it works under a base URL."""
    return f"{REPORT_URL_PREFIX.lstrip('/')}/dags/{{DAG_ID}}/runs/{{RUN_ID}}/"
