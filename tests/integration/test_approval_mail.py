"""Issue 13 item 2: the approval notifier mails the approvers, for real.

`approval_notify: smtp` (docker/, or the embedded default with
RULE_LIFECYCLE_APPROVAL_NOTIFY=smtp) sends through the SMTP provider's notifier and an
Airflow connection. Here the connection points at an SMTP server in this process
(aiosmtpd on a free port): the mail crosses TCP, and the test reads what arrived.
"""

from __future__ import annotations

import json
from email import message_from_bytes, policy
from pathlib import Path

import pytest

aiosmtpd = pytest.importorskip("aiosmtpd.controller", reason="aiosmtpd (dev extra) not installed")

from spark_jobs.kafka.broker import free_port  # noqa: E402

COMMIT = "3ef7810682b9c0ffee00112233445566778899aa"


class Inbox:
    """aiosmtpd handler: keeps every envelope it receives."""

    def __init__(self) -> None:
        self.envelopes: list = []

    async def handle_DATA(self, server, session, envelope) -> str:  # noqa: N802 - aiosmtpd's hook name
        self.envelopes.append(envelope)
        return "250 Message accepted for delivery"


@pytest.fixture
def smtp_server():
    inbox = Inbox()
    port = free_port()
    controller = aiosmtpd.Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    yield inbox, port
    controller.stop()


class FakeTI:
    """What the notifier reads from the run: the release candidate and the validation."""

    def __init__(self, xcoms: dict) -> None:
        self.xcoms = xcoms

    def xcom_pull(self, task_ids: str) -> dict | None:
        return self.xcoms.get(task_ids)


def test_the_approvers_get_a_mail_naming_the_release_with_a_link_to_the_approval(
    smtp_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inbox, port = smtp_server
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_APPROVALS", json.dumps({
        "conn_type": "smtp", "host": "127.0.0.1", "port": port,
        "extra": {"disable_ssl": True, "disable_tls": True, "from_email": "rule-platform@example.com"},
    }))
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "http://airflow.example:8080")
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "plugins"))  # as Airflow loads it
    from airflow.sdk import DAG
    from rule_lifecycle.notifiers import ApprovalRequestNotifier

    hostile = "feat/{{ 7 * 7 }}<b>x</b>"  # a branch name is the author's text: must be inert
    candidate = {
        "commit": COMMIT, "short": COMMIT[:12], "repo": "/srv/rules.git", "branch": hostile,
        "authors": [{"name": "Carol <script>", "email": "carol@example.com"}],
        "subject": "<img src=x onerror=alert(1)> {{ conn.smtp_approvals.host }}",
        "settings": {"approval_notify": "smtp", "approvers_email": "alice@example.com, bob@example.com",
                     "smtp_conn_id": "smtp_approvals", "state_dir": str(tmp_path)},
    }
    validation = {"changed_rule_ids": ["rapid_clicks", "purchase_threshold"]}
    run_id = "scheduled__2026-11-23T20:00:00+00:00"
    context = {"ti": FakeTI({"detect_commit": candidate, "validate_rules": validation}),
               "dag": DAG("rule_release", schedule=None), "run_id": run_id}

    ApprovalRequestNotifier()(context)

    assert len(inbox.envelopes) == 1
    env = inbox.envelopes[0]
    assert sorted(env.rcpt_tos) == ["alice@example.com", "bob@example.com"]
    assert env.mail_from == "rule-platform@example.com"
    mail = message_from_bytes(env.content, policy=policy.default)
    subject = str(mail["Subject"])
    assert COMMIT[:12] in subject and "waits for approval" in subject and "\n" not in subject
    html = next(p for p in mail.walk() if p.get_content_type() == "text/html").get_content()
    # The release and the way to the approval (the run's required action) and the report.
    assert COMMIT[:12] in html and "rapid_clicks" in html and "purchase_threshold" in html
    approve = ("http://airflow.example:8080/dags/rule_release/runs/scheduled__2026-11-23T20%3A00%3A00%2B00%3A00"
               "/tasks/approve/required_actions")
    assert f'href="{approve}"' in html
    # Nothing from git is markup or a template there: escaped, never evaluated.
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html
    assert "{{ 7 * 7 }}" in html and "49" not in html
    assert "onerror" not in html and "<script>" not in html and "127.0.0.1" not in html
