"""Telling the approvers that a release waits for them: an Airflow notifier.

The approval step (HITLOperator) calls its notifiers when it starts waiting. This one
reads the run's settings (travelling in the release candidate) and

- `approval_notify: file` (the embedded default): appends one JSON line per request to
  `<state_dir>/notifications/approvals.jsonl` (mode 0600) and logs it;
- `approval_notify: smtp` (docker/): mails `approvers_email` through the SMTP provider's
  SmtpNotifier and the Airflow connection `smtp_conn_id`.

The message carries links and the commit id, not the commit's text: its subject line is
the author's, and a mail must not let it speak for the platform. The HTML is rendered
by Jinja2 with autoescape all the same.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from airflow.sdk.bases.notifier import BaseNotifier

log = logging.getLogger(__name__)

_HTML = """<p>Rule release <code>{{ short }}</code> of {{ repo }} ({{ branch }}) waits for an approver.</p>
<p><a href="{{ approve_url }}">Open the approval</a> · <a href="{{ report_url }}">backtest report</a></p>
<p>Rules: {{ rules | join(', ') }}. Authors of the release may not approve it (four eyes).</p>"""


def _append_private(path: Path, line: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, stat.S_IRUSR | stat.S_IWUSR)
    with os.fdopen(fd, "a", encoding="utf-8") as fh:
        fh.write(line + "\n")


class ApprovalRequestNotifier(BaseNotifier):
    """Notify the approvers of a pending release approval (file/log or SMTP)."""

    template_fields = ()

    def notify(self, context: Any) -> None:
        from airflow.configuration import conf
        from jinja2 import Environment

        from spark_jobs.lifecycle.release import report_url
        from spark_jobs.lifecycle.settings import LifecycleSettings

        ti = context["ti"]
        candidate = ti.xcom_pull(task_ids="detect_commit") or {}
        validation = ti.xcom_pull(task_ids="validate_rules") or {}
        settings = LifecycleSettings.from_dict(candidate.get("settings") or {})
        dag_id, run_id = context["dag"].dag_id, context["run_id"]
        base = (conf.get("api", "base_url", fallback="") or "").rstrip("/")
        message = {
            "at": datetime.now(tz=UTC).isoformat(timespec="seconds"),
            "dag_id": dag_id,
            "run_id": run_id,
            "commit": candidate.get("commit"),
            "short": candidate.get("short"),
            "repo": candidate.get("repo"),
            "branch": candidate.get("branch"),
            "rules": list(validation.get("changed_rule_ids") or []),
            "authors": sorted({a.get("email") for a in candidate.get("authors") or [] if a.get("email")}),
            "approve_url": f"{base}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}/tasks/approve/required_actions",
            "report_url": report_url(dag_id, run_id, base),
            "to": settings.approvers_email or None,
        }
        # One header line whatever the commit id or branch hold (no header injection).
        subject = f"Rule release {message['short']} of {message['branch'] or settings.branch} waits for approval"
        subject = "".join(ch for ch in subject if ch.isprintable())[:200]
        if settings.approval_notify == "smtp":
            from airflow.providers.smtp.notifications.smtp import SmtpNotifier

            if not settings.approvers_email:
                raise ValueError("approval_notify is smtp but approvers_email is not set")
            html = Environment(autoescape=True).from_string(_HTML).render(**message)
            # `.notify`, not `(context)`: calling the notifier would render subject and
            # body once more as Airflow templates, and a `{{ ... }}` in anything taken
            # from git would then be evaluated (with `conn`, `var` in reach); both are
            # final text here (tests/integration/test_approval_mail.py).
            SmtpNotifier(
                to=settings.approvers_email, subject=subject, html_content=html, smtp_conn_id=settings.smtp_conn_id
            ).notify(context)
            log.info("Approval request mailed to %s", settings.approvers_email)
            return
        path = Path(settings.state_dir) / "notifications" / "approvals.jsonl"
        _append_private(path, json.dumps({"subject": subject, **message}, sort_keys=True))
        log.info("APPROVAL REQUESTED: %s; approve at %s (notification in %s)", subject, message["approve_url"], path)
