"""rule_release: a commit to rules/ -> validate -> backtest -> approval in the UI -> publish.

Polls the rules repository (every RULE_RELEASE_POLL_MINUTES, default 5) and runs once per
new commit on the tracked branch; trigger it with `{"commit": "<sha>"}` to release a
given commit. Invalid rules end the run at `validate_rules` with file/field/reason in
its log. The approver reads the report (linked from the approval page and shown in the
run's "Backtest report" tab) and approves or rejects in Airflow's Required Actions page;
only an approval publishes, and `record_outcome` writes the decision to the audit log
(`rulectl history RULE_ID`) and to the run's note. Only a Rule approver who wrote no
commit of the release can answer (four eyes, enforced by the api-server); a newer
commit's run supersedes a pending older one (`claim_release`). Tracked by default: the
`main` branch of the project checkout; the Variable `rule_lifecycle` ("repo",
"branch") changes it. Params are an allow-list (spark_jobs/lifecycle/params.py). The
logic lives in spark_jobs.lifecycle and plugins/.
"""

from __future__ import annotations

import logging
import os
from datetime import datetime, timedelta

from airflow.sdk import DAG, Param, get_current_context, task
from airflow.sdk.exceptions import AirflowFailException
from airflow.task.trigger_rule import TriggerRule
from rule_lifecycle.defaults import TASK_DEFAULTS
from rule_lifecycle.hooks import AirflowApiHook, RulesTopicHook
from rule_lifecycle.notifiers import ApprovalRequestNotifier
from rule_lifecycle.operators import PublishRulesOperator, ReleaseApprovalOperator, RuleBacktestOperator
from rule_lifecycle.sensors import RulesCommitSensor

from spark_jobs.lifecycle import release
from spark_jobs.lifecycle.params import ReleaseParams, param_schema
from spark_jobs.platform.identity import APPROVER, assigned_to_role

log = logging.getLogger(__name__)
POLL = timedelta(minutes=float(os.environ.get("RULE_RELEASE_POLL_MINUTES", "5")))
# How often the sensor looks at the branch: the wait between a commit and its release
# starting. A look is a `git fetch` of the tracked branch, so it can be frequent.
POKE = timedelta(seconds=float(os.environ.get("RULE_RELEASE_POKE_SECONDS", "10")))


def _setting(name: str) -> str:
    """Jinja for one of the run's resolved settings (pushed by detect_commit)."""
    return "{{ ti.xcom_pull(task_ids='detect_commit')['settings']['" + name + "'] }}"


def _run_ids() -> tuple[str, str]:
    ctx = get_current_context()
    return ctx["dag"].dag_id, ctx["run_id"]


def _topic_hook(candidate: dict) -> RulesTopicHook:
    s = candidate["settings"]
    return RulesTopicHook(s["kafka_conn_id"], bootstrap=s["bootstrap"], topic=s["rules_topic"])


with DAG(
    dag_id="rule_release",
    description="Validate, backtest, approve and publish the rules of a new commit",
    schedule=POLL,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    # Releases do not queue behind each other: a newer commit supersedes a pending older
    # one (claim_release), so a hotfix never waits for last week's approval.
    max_active_runs=4,
    on_failure_callback=lambda context: release.record_failure(context),
    tags=["rules", "release"],
    default_args=TASK_DEFAULTS,
    params={
        # Allow-listed (spark_jobs/lifecycle/params.py): Airflow refuses anything else at trigger time.
        "commit": Param(None, **param_schema(ReleaseParams, "commit")),
        "settings": Param({}, **param_schema(ReleaseParams, "settings")),
    },
    doc_md=__doc__,
) as dag:
    # Poke mode: one task process looks every POKE for the run's poll period. In
    # reschedule mode every look would be a new task process (start-up and DAG parse
    # cost more CPU than the git fetch itself), which kept the interval long and the
    # commit waiting; one worker slot held per poll period is the cheaper price.
    detect = RulesCommitSensor(
        task_id="detect_commit",
        commit="{{ params.commit or '' }}",
        mode="poke",
        poke_interval=POKE.total_seconds(),
        timeout=POLL.total_seconds() * 0.9,
        soft_fail=True,
    )

    @task.short_circuit
    def claim_release(candidate: dict) -> bool:
        """Take the commit, or stand down (the whole run skips) when another run holds it;
        supersede pending releases of older commits of the branch and end their runs
        (their approval fails, the run's note says by what), so they never publish."""
        dag_id, run_id = _run_ids()
        claim = release.claim_release(candidate, dag_id=dag_id, run_id=run_id)
        if not claim["claimed"]:
            log.info("Commit %s is being released by run %s: nothing for this run to do.",
                     candidate["short"], claim["held_by"])
            return False
        api = AirflowApiHook()
        for p in claim["superseded"]:
            note = f"Superseded by {candidate['short']} (run {run_id}): this run publishes nothing."
            log.warning("Run %s (commit %s) is superseded by %s", p["run_id"], p["commit"][:12], candidate["short"])
            if api.available():
                api.end_run(p.get("dag_id") or dag_id, p["run_id"], note)
            else:
                log.warning("No connection %s: run %s keeps waiting, but will not publish.", api.conn_id, p["run_id"])
        return True

    @task.short_circuit(ignore_downstream_trigger_rules=False)
    def not_superseded(candidate: dict) -> bool:
        """Publish only if no newer release superseded this one while it waited."""
        by = release.superseded(candidate, _run_ids()[1])
        if by:
            log.warning("Not publishing: %s", by.get("reason"))
        return by is None

    @task(multiple_outputs=True)
    def validate_rules(candidate: dict) -> dict:
        """`rulectl validate --base <last published commit>` on the commit, vs the live rules."""
        dag_id, run_id = _run_ids()
        live = _topic_hook(candidate).current_rules()
        try:
            validation = release.validate_candidate(candidate, live)
        except release.ValidationFailed as exc:
            for e in exc.errors:
                log.error("INVALID RULE %s: field '%s': %s", e["file"], e["field"], e["reason"])
            release.record_decision(
                candidate, None, event="invalid", dag_id=dag_id, run_id=run_id, reason=str(exc), errors=exc.errors
            )
            raise AirflowFailException(f"Validation failed for {candidate['short']}: {exc}") from None
        log.info("Valid. Changed rules vs rules.active: %s", validation["changed_rule_ids"] or "none")
        validation["live_rules"] = live
        validation["to_publish"] = release.rules_to_publish(validation)
        # Read by the api-server's four-eyes check: a shadow's approver does not promote it.
        validation["promotes"] = release.shadow_promotions(validation, live, release.audit_records(candidate))
        return validation

    # One task, not a `has_changes` short-circuit before it: every task is a process to
    # start and a scheduler round to wait for, on the path of every release.
    @task.short_circuit(multiple_outputs=True)
    def plan_backtests(candidate: dict, validation: dict) -> dict:
        """The window of history and the two backtests to run; no Spark here, so the
        backtests and the quality check start together. Stops the run (nothing to
        release) when the commit's rules are exactly the live ones."""
        dag_id, run_id = _run_ids()
        if not validation["changed_rule_ids"]:
            log.info("Nothing to release: the rules at %s are what %s holds.", candidate["short"], candidate["settings"]["rules_topic"])
            release.record_decision(candidate, validation, event="no_change", dag_id=dag_id, run_id=run_id, reason="no rule changed")
            return {}  # falsy: skips everything downstream
        plan = release.plan_release_backtests(candidate, validation, validation["live_rules"], dag_id=dag_id, run_id=run_id)
        log.info("Window %s; backtests on %s", plan["window"], plan["candidate"]["remote"] or "a Spark of their own")
        return {**plan, "settings": candidate["settings"]}

    @task
    def check_history(candidate: dict, validation: dict, plan: dict) -> dict:
        """The history's Great Expectations suite (Data Docs next to the report), run
        alongside the backtests: it reads the same window and decides nothing they need."""
        q = release.check_release_history(candidate, validation, plan)
        (log.info if q["success"] else log.warning)(
            "History data quality %s (%s failed expectation(s)); window %s",
            "passed" if q["success"] else "FAILED",
            q["failed_expectations"],
            plan["window"],
        )
        return q

    # Not NONE_FAILED: an idle poll skips every task before this one, and a task that
    # ran on skipped inputs would fail on their missing XComs (a red run for no reason).
    @task(trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS)
    def build_report(candidate: dict, validation: dict, plan: dict, quality: dict) -> dict:
        """report.html + report.json, and the approval page text."""
        from airflow.configuration import conf

        dag_id, run_id = _run_ids()
        base_url = conf.get("api", "base_url", fallback="") or ""
        from urllib.parse import urlparse

        result = release.build_release_report(
            candidate, validation, release.with_quality(plan, quality), validation["live_rules"],
            dag_id=dag_id, run_id=run_id, base_url=urlparse(base_url).path,
        )
        get_current_context()["ti"].xcom_push(key=release.REPORT_XCOM_KEY, value=result)
        log.info("Report: %s (served at %s)", result["html"], result["url"])
        return result

    @task(trigger_rule=TriggerRule.NONE_FAILED_MIN_ONE_SUCCESS)
    def record_outcome(candidate: dict, validation: dict, report: dict) -> str:
        """Write the decision (who, when, what) to the audit log and say it in the log."""
        ctx = get_current_context()
        dag_id, run_id = _run_ids()
        outcome = release.approval_outcome(ctx["ti"].xcom_pull(task_ids="approve", key="response"))
        published = ctx["ti"].xcom_pull(task_ids="publish")
        who = (outcome["by"] or {}).get("name") or "?"
        by = release.superseded(candidate, run_id)
        if by is not None:
            msg = f"{by.get('reason')}; {outcome['chosen'] or 'no answer'} by {who} came too late. Nothing was published."
        elif outcome["approved"] and published is not None:
            release.record_decision(
                candidate, validation, event="published", dag_id=dag_id, run_id=run_id,
                approval=outcome, published=published, report=report["html"], report_sha256=report.get("sha256"),
            )
            msg = f"Approved by {who} at {outcome['at']}: published {published['published'] or 'nothing new'}"
        else:
            reason = outcome["comment"] or "no reason given"
            release.record_decision(
                candidate, validation, event="rejected", dag_id=dag_id, run_id=run_id,
                approval=outcome, report=report["html"], report_sha256=report.get("sha256"), reason=reason,
            )
            msg = f"Rejected by {who} at {outcome['at']}: {reason}. Nothing was published."
        log.info(msg)
        # The run's note says the decision (the grid marks runs with a note; the run's
        # page and the API show it): a rejected release must not read as just another
        # green run. Airflow 3.3 has no run state for "decided no" (a failed run would be
        # red for a healthy decision), so the note is the mark; it needs the release
        # service's API connection.
        note = ("REJECTED: " if not outcome["approved"] and by is None else "") + msg
        api = AirflowApiHook()
        if api.available():
            api.set_note(dag_id, run_id, note)
        else:
            log.warning("No connection %s: the run's note cannot say %r; the audit log has the decision.",
                        api.conn_id, note[:200])
        return msg

    candidate = detect.output
    claim = claim_release(candidate)
    validation = validate_rules(candidate)
    claim >> validation
    plan = plan_backtests(candidate, validation)
    quality = check_history(candidate, validation, plan)
    bt_candidate = RuleBacktestOperator(
        task_id="backtest_candidate", backtest=plan["candidate"], inputs=plan["inputs"], settings=plan["settings"]
    )
    bt_published = RuleBacktestOperator(
        task_id="backtest_published", backtest=plan["published"], inputs=plan["inputs"], settings=plan["settings"]
    )
    report = build_report(candidate, validation, plan, quality)
    [bt_candidate, bt_published] >> report
    approve = ReleaseApprovalOperator(
        task_id="approve",
        subject="{{ ti.xcom_pull(task_ids='build_report')['subject'] }}",
        body="{{ ti.xcom_pull(task_ids='build_report')['approval_body'] }}",
        params={
            "comment": Param(None, type=["null", "string"], title="Comment", description="Why (kept in the audit log)"),
            # The approver's choice (issue 39): in force, or as a shadow beside the
            # version in force (docs/rule-language.md, "Shadow versions").
            "release_as": Param("active", type="string", enum=["active", "shadow"], title="Release as",
                                description="active: the version replaces the one in force. shadow: it runs beside "
                                            "it, its detections go to events.shadow only (rulectl shadow RULE_ID)."),
        },
        response_timeout=timedelta(days=7),
        # Assigned to the Rule approver role (spark_jobs/platform/auth.py); four eyes are
        # enforced by the api-server (rule_lifecycle/four_eyes.py): only an approver who
        # wrote no commit of the release can answer.
        assigned_users=[assigned_to_role(APPROVER, "Rule approvers")],
        notifiers=[ApprovalRequestNotifier()],
    )
    publish = PublishRulesOperator(
        task_id="publish",
        rules=validation["to_publish"],
        kafka_config_id=_setting("kafka_conn_id"),
        bootstrap=_setting("bootstrap"),
        topic=_setting("rules_topic"),
        commit="{{ ti.xcom_pull(task_ids='detect_commit')['commit'] }}",
        published_by="{{ ((ti.xcom_pull(task_ids='approve', key='response') or {}).get('responded_by_user') or {}).get('name', '') }}",
        mode="{{ ((ti.xcom_pull(task_ids='approve', key='response') or {}).get('params_input') or {}).get('release_as') or 'active' }}",
    )
    report >> approve >> not_superseded(candidate) >> publish >> record_outcome(candidate, validation, report)
