"""The platform's auth manager: FAB's, plus human-in-the-loop steps assigned to a role.

Airflow assigns a HITL step to users by id (`assigned_users`) and leaves the check to
the auth manager (`is_authorized_hitl_task`, meant to be overridden). A release's
approval must go to whoever holds the approver role now, not to a list of ids a task
would have to look up (tasks do not read the auth manager's tables). So an assignee id
of the form `role:<FAB role name>` stands for every member of that role; plain user ids
keep working. The four-eyes rule (plugins/rule_lifecycle/four_eyes.py) narrows it
further to approvers who wrote none of the release.

Configure with `AIRFLOW__CORE__AUTH_MANAGER=spark_jobs.platform.auth.RulePlatformAuthManager`
(`rulectl up`, docker/ and the test fixtures do).
"""

from __future__ import annotations

from typing import Any

from airflow.providers.fab.auth_manager.fab_auth_manager import FabAuthManager

from spark_jobs.platform.identity import ROLE_PREFIX


def _role_names(user_id: str) -> set[str]:
    """The user's FAB roles, read fresh (a user object from a token may be detached)."""
    from airflow.providers.fab.auth_manager.models import User
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.get(User, int(user_id))
        return {r.name for r in row.roles} if row is not None else set()


class RulePlatformAuthManager(FabAuthManager):
    """FAB's auth manager with role assignees for HITL steps (see module docstring)."""

    def is_authorized_hitl_task(self, *, assigned_users: set[str], user: Any) -> bool:
        if user.get_id() in assigned_users:
            return True
        wanted = {a[len(ROLE_PREFIX):] for a in assigned_users if a.startswith(ROLE_PREFIX)}
        return bool(wanted and wanted & _role_names(user.get_id()))
