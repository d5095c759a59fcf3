"""The params allow-list at trigger time, enforced in the api-server.

Airflow validates each *declared* DAG Param against its JSON Schema when a run is
created (REST API, UI form, backfill), but an *undeclared* top-level key passes:
`SerializedParamsDict.deep_merge` adds it as a Param without a schema, and Airflow
3.3 has no DAG-level switch to refuse it (no `additionalProperties` for the params as
a whole). A trigger such as `{"spark_conf": {...}}` would then create a run, and only
its first task would refuse it. This middleware checks the conf of every request that
creates runs of a DAG with an allow-list (spark_jobs.lifecycle.params.ALLOW_LISTS)
against the same pydantic model the tasks use, and answers 400 with every offending
key before Airflow creates anything:

- `POST /api/v2/dags/<dag>/dagRuns` (REST API and the UI's trigger form): `conf`;
- `POST /api/v2/backfills` and `/api/v2/backfills/dry_run`: `dag_run_conf` for `dag_id`;
- `POST /execution/dag-runs/<dag>/<run>` (a task's TriggerDagRunOperator): `conf`.

A body that is not a JSON object is left to Airflow (it answers 422).
"""

from __future__ import annotations

import json
import re
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_TRIGGER = re.compile(r"/api/v2/dags/(?P<dag>[^/]+)/dagRuns/?$")
_BACKFILL = re.compile(r"/api/v2/backfills(?:/dry_run)?/?$")
_EXECUTION_TRIGGER = re.compile(r"/execution/dag-runs/(?P<dag>[^/]+)/(?P<run>[^/]+)/?$")


def refusal(dag_id: str, conf: Any) -> str | None:
    """Why `conf` may not start a run of `dag_id`, or None (also for DAGs without an allow-list)."""
    from spark_jobs.lifecycle.params import ALLOW_LISTS, ParamsRejected, validate_params

    model = ALLOW_LISTS.get(dag_id)
    if model is None or conf is None:
        return None
    if not isinstance(conf, dict):
        return f"refused trigger params: the conf of {dag_id} must be a JSON object"
    try:
        validate_params(model, conf)
    except ParamsRejected as exc:
        return f"{exc} (the params of {dag_id} are an allow-list)"
    return None


def _target(path: str, body: dict) -> tuple[str | None, Any, bool]:
    """(dag_id, conf, execution API?) of a run-creating request, or (None, None, False)."""
    if m := _TRIGGER.search(path):
        return m["dag"], body.get("conf"), False
    if _BACKFILL.search(path):
        dag = body.get("dag_id")
        return (dag if isinstance(dag, str) else None), body.get("dag_run_conf"), False
    if m := _EXECUTION_TRIGGER.search(path):
        return m["dag"], body.get("conf"), True
    return None, None, False


class TriggerParamsMiddleware:
    """ASGI middleware: a run-creating request whose conf leaves the DAG's allow-list gets a 400."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if scope.get("method") != "POST" or not (
            _TRIGGER.search(path) or _BACKFILL.search(path) or _EXECUTION_TRIGGER.search(path)
        ):
            await self.app(scope, receive, send)
            return
        raw, messages = await _read_body(receive)
        try:
            body = json.loads(raw or b"null")
        except ValueError:
            body = None
        if isinstance(body, dict):
            from urllib.parse import unquote

            dag_id, conf, execution = _target(path, body)
            reason = refusal(unquote(dag_id), conf) if dag_id else None
            if reason is not None:
                detail: Any = {"reason": "params_refused", "message": reason} if execution else reason
                await JSONResponse({"detail": detail}, status_code=400)(scope, _replay(messages, receive), send)
                return
        await self.app(scope, _replay(messages, receive), send)


async def _read_body(receive: Receive) -> tuple[bytes, list[Message]]:
    """The whole request body, and the messages it came in (to hand on unchanged)."""
    messages: list[Message] = []
    chunks: list[bytes] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break  # http.disconnect
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks), messages


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """A `receive` that gives the buffered messages again, then the client's own."""
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
