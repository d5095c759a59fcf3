"""The backtest report inside the Airflow UI: a FastAPI app mounted on the api-server.

Each report-producing task pushes an XCom `rule_report` ({"dir", "html", ...}); this app
finds a run's report through that XCom (so the api-server needs no settings of its own)
and serves report.html and the files next to it (Data Docs). Access needs the same
right as reading the DAG run, checked by Airflow's auth manager from the UI session
cookie or a bearer token.
"""

from __future__ import annotations

import html
import mimetypes
from pathlib import Path

from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse

from spark_jobs.lifecycle.release import REPORT_URL_PREFIX, REPORT_XCOM_KEY

try:  # the auth dependency exists only inside the api-server package
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api.security import requires_access_dag

    _RUN_ACCESS = [Depends(requires_access_dag(method="GET", access_entity=DagAccessEntity.RUN))]
    _ANY_DAG_ACCESS = [Depends(requires_access_dag(method="GET"))]
except ImportError:  # pragma: no cover
    _RUN_ACCESS = []
    _ANY_DAG_ACCESS = []

app = FastAPI(title="Rule lifecycle reports", docs_url=None, redoc_url=None, openapi_url=None)


def _report_entry(dag_id: str, run_id: str) -> dict:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        row = session.scalars(
            select(XComModel)
            .where(XComModel.dag_id == dag_id, XComModel.run_id == run_id, XComModel.key == REPORT_XCOM_KEY)
            .order_by(XComModel.timestamp.desc())
            .limit(1)
        ).first()
        value = XComModel.deserialize_value(row) if row is not None else None
    if not isinstance(value, dict) or not value.get("dir"):
        raise HTTPException(404, f"No backtest report for run {run_id!r} of {dag_id!r} (yet).")
    return value


def _safe_file(root: Path, rel: str) -> Path:
    base = root.resolve()
    target = (base / rel).resolve()
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
    entry = _report_entry(dag_id, run_id)
    return FileResponse(_safe_file(Path(entry["dir"]), "report.html"), media_type="text/html")


@app.get("/dags/{dag_id}/runs/{run_id}/{path:path}", dependencies=_RUN_ACCESS)
def report_file(dag_id: str, run_id: str, path: str) -> FileResponse:
    """report.json, Data Docs pages and anything else written next to the report."""
    entry = _report_entry(dag_id, run_id)
    target = _safe_file(Path(entry["dir"]), path)
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


def report_href_template() -> str:
    """External-view href: relative (no leading slash) so it works under a base URL."""
    return f"{REPORT_URL_PREFIX.lstrip('/')}/dags/{{DAG_ID}}/runs/{{RUN_ID}}/"
