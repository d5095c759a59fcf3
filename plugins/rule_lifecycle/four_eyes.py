"""Four eyes on the release approval, enforced in the api-server.

Every answer to a human-in-the-loop step, from the UI's Required Actions page or the
REST API, is a `PATCH .../taskInstances/<task>/hitlDetails`. For the release DAG's
approval step this middleware checks, before Airflow records the answer, that the
responding user holds an approver role, did not author or commit any commit of the
release and, when the release puts a shadow in force, did not approve that shadow
(spark_jobs.lifecycle.governance); otherwise it refuses with the reason.

How the refusal reads: an API client (bearer token) gets 403 `{"detail": reason}`. The
UI (a browser session: the `_token` cookie, no Authorization header) would show no
reason for a 403: Airflow 3.3's UI drops the body of every error status its generated
client names (400, 403, 409, ...: the toast says "Forbidden" or, for 403, only the
generic "Access Denied"), and prints the body only for a status it does not name
("Generic Error: status: ...; body: {...}", the toast of the hitlDetails PATCH's
`onError`). So a browser session gets `UI_REFUSAL_STATUS`, a client error no
registry assigns, with the same body, and the approver reads the reason on screen.
Airflow's UI offers the Approve/Reject buttons to everyone who can read the step
(neither `assigned_users` nor permissions hide them in 3.3), which is why the reason
must be readable there.

Why here and not in the task: the user's e-mail and roles live in the auth manager's
tables, which the api-server reads and task processes must not; and Airflow's own
`assigned_users` needs user ids that only the api-server knows. The release's authors
come from the run's `detect_commit` XCom and the shadows it promotes from its
`validate_rules` XCom, both written by the release itself (only operators may write
XComs through the API).
"""

from __future__ import annotations

import re
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

# 4xx (so the UI does not retry it) and absent from the status names of the UI's
# generated OpenAPI client (`catchErrorCodes` in its request code; checked in the
# bundle of the installed Airflow 3.3.2, airflow/ui/dist/assets/index-*.js).
UI_REFUSAL_STATUS = 432
RELEASE_DAG = "rule_release"
APPROVAL_TASK = "approve"
CANDIDATE_TASK = "detect_commit"
VALIDATION_TASK = "validate_rules"
_HITL_PATH = re.compile(
    r"/api/v2/dags/(?P<dag>[^/]+)/dagRuns/(?P<run>[^/]+)/taskInstances/(?P<task>[^/]+)(?:/-?\d+)?/hitlDetails/?$"
)


def _xcom(dag_id: str, run_id: str, task_id: str, key: str) -> Any:
    """One XCom of the run, read from the metadata DB (None when absent)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        row = session.scalars(
            select(XComModel)
            .where(XComModel.dag_id == dag_id, XComModel.run_id == run_id, XComModel.task_id == task_id,
                   XComModel.key == key)
            .limit(1)
        ).first()
        return XComModel.deserialize_value(row) if row is not None else None


def _release_authors(dag_id: str, run_id: str) -> list[dict] | None:
    """The `authors` of the run's release candidate (None when there is none yet)."""
    value = _xcom(dag_id, run_id, CANDIDATE_TASK, "return_value")
    if not isinstance(value, dict) or not isinstance(value.get("authors"), list):
        return None
    return value["authors"]


def _promotions(dag_id: str, run_id: str) -> list[dict]:
    """The shadows the run's release would put in force (its validation's `promotes`)."""
    value = _xcom(dag_id, run_id, VALIDATION_TASK, "promotes")
    return [p for p in value if isinstance(p, dict)] if isinstance(value, list) else []


def _identity(user_id: str) -> tuple[str, str | None, list[str]]:
    """Username, e-mail and role names of an auth-manager user, read fresh from the DB."""
    from airflow.providers.fab.auth_manager.models import User
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.get(User, int(user_id))
        if row is None:
            return user_id, None, []
        return row.username, row.email, [r.name for r in row.roles]


def _decide(user: Any, dag_id: str, run_id: str) -> str | None:
    from spark_jobs.lifecycle.governance import refusal
    from spark_jobs.platform.identity import APPROVER_ROLES

    username, email, roles = _identity(user.get_id())
    return refusal(
        username=username,
        email=email,
        roles=roles,
        approver_roles=APPROVER_ROLES,
        authors=_release_authors(dag_id, run_id),
        promotions=_promotions(dag_id, run_id),
        user_id=user.get_id(),
    )


class FourEyesMiddleware:
    """ASGI middleware: refuses an approval response that breaks the four-eyes rule."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("method") == "PATCH":
            m = _HITL_PATH.search(scope.get("path", ""))
            if m and m["dag"] == RELEASE_DAG and m["task"] == APPROVAL_TASK:
                request = Request(scope)
                reason = await self._check(request, m["dag"], m["run"])
                if reason is not None:
                    status = 403 if request.headers.get("authorization") else UI_REFUSAL_STATUS
                    await JSONResponse({"detail": reason}, status_code=status)(scope, receive, send)
                    return
        await self.app(scope, receive, send)

    async def _check(self, request: Request, dag_id: str, run_id: str) -> str | None:
        from airflow.api_fastapi.app import get_auth_manager

        header = request.headers.get("authorization", "")
        token = header[7:] if header.lower().startswith("bearer ") else request.cookies.get("_token")
        if not token:
            return None  # unauthenticated: Airflow itself answers 401
        try:
            user = await get_auth_manager().get_user_from_token(token)
        except Exception:  # noqa: BLE001 - an invalid token: Airflow itself answers 401/403
            return None
        return await run_in_threadpool(_decide, user, dag_id, run_id)
