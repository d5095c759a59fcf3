"""backtest_report: the published rule set over the last day of history, every day.

Reads the live rules from `rules.active`, checks the history with Great Expectations,
backtests on Spark (the platform's Spark Connect server, else SparkSubmitOperator) and
keeps a dated report per run under `<report_dir>/backtest_report/<YYYY-MM-DD>/`, shown
in the run's "Backtest report" tab.
Schedule: RULE_BACKTEST_REPORT_SCHEDULE (default @daily). Logic: spark_jobs.lifecycle.
"""

from __future__ import annotations

import logging

from airflow.sdk import DAG, Param, get_current_context, task
from airflow.task.trigger_rule import TriggerRule
from rule_lifecycle.defaults import TASK_DEFAULTS, periodic
from rule_lifecycle.hooks import RulesTopicHook
from rule_lifecycle.operators import RuleBacktestOperator

from spark_jobs.lifecycle import scheduled
from spark_jobs.lifecycle.params import ReportParams, param_schema
from spark_jobs.lifecycle.release import REPORT_XCOM_KEY, report_key
from spark_jobs.lifecycle.settings import run_settings

log = logging.getLogger(__name__)

with DAG(
    dag_id="backtest_report",
    description="Daily backtest report of the published rules",
    # First run at the next scheduled time (rule_lifecycle.defaults.periodic).
    schedule=periodic("RULE_BACKTEST_REPORT_SCHEDULE", "@daily"),
    catchup=False,
    max_active_runs=1,
    tags=["rules", "report"],
    default_args=TASK_DEFAULTS,
    # Allow-listed (spark_jobs/lifecycle/params.py): Airflow refuses anything else at trigger time.
    params={"settings": Param({}, **param_schema(ReportParams, "settings"))},
    doc_md=__doc__,
) as dag:

    @task(multiple_outputs=True)
    def prepare() -> dict:
        """Live rules, history window + slice + data quality, backtest plan."""
        ctx = get_current_context()
        settings = run_settings(dict(ctx["params"]), ReportParams)
        live = RulesTopicHook(settings.kafka_conn_id, bootstrap=settings.bootstrap, topic=settings.rules_topic).current_rules()
        when = ctx.get("data_interval_end") or ctx.get("logical_date")
        run = ctx["dag_run"]
        # The same key the report view derives from the DagRun row (never from XCom).
        key = report_key(ctx["dag"].dag_id, ctx["run_id"], run.logical_date, run.data_interval_end, run.run_after)
        plan = scheduled.plan_scheduled(
            settings, live, dag_id=ctx["dag"].dag_id, run_id=ctx["run_id"], report_key=key, interval_end=when
        )
        log.info("%d live rule(s); window %s; data quality %s", len(live), plan["window"], plan["quality"]["success"])
        return plan

    @task(trigger_rule=TriggerRule.NONE_FAILED)
    def build_report(plan: dict) -> dict:
        """The dated report (HTML + JSON), with the trend of earlier days."""
        ctx = get_current_context()
        result = scheduled.build_scheduled_report(plan, dag_id=ctx["dag"].dag_id, run_id=ctx["run_id"])
        ctx["ti"].xcom_push(key=REPORT_XCOM_KEY, value=result)
        log.info("Report: %s; detections per rule: %s", result["html"], result["detections"])
        return result

    plan = prepare()
    backtest = RuleBacktestOperator(
        task_id="backtest_published_rules", backtest=plan["backtest"], inputs=plan["inputs"], settings=plan["settings"]
    )
    backtest >> build_report(plan)
