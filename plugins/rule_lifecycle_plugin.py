"""Registers the rule-lifecycle plugin: the report app, its UI entries and the operator link.

- FastAPI app under /rule-reports (plugins/rule_lifecycle/views.py);
- a "Backtest report" tab on every DAG run page (external view, destination dag_run)
  and a "Backtest reports" entry in the navigation;
- "Explain a detection" in the navigation: recent detections and each one's evidence
  chain (/rule-reports/detections/); "Shadow versions": the shadows on rules.active,
  each against its version in force (/rule-reports/shadows/);
- a "Backtest report" extra link on the approval and backtest tasks;
- the four-eyes check on answers to the release approval (rule_lifecycle/four_eyes.py);
- the params allow-list on every request that creates runs of a platform DAG
  (rule_lifecycle/trigger_params.py).
"""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from airflow.providers.standard.operators.hitl import ApprovalOperator
from airflow.sdk import BaseOperatorLink
from rule_lifecycle.four_eyes import FourEyesMiddleware
from rule_lifecycle.operators import ReleaseApprovalOperator, RuleBacktestOperator
from rule_lifecycle.trigger_params import TriggerParamsMiddleware
from rule_lifecycle.views import app, report_href_template

from spark_jobs.lifecycle.release import REPORT_URL_PREFIX, report_url


class BacktestReportLink(BaseOperatorLink):
    """Extra link on a task to its run's backtest report."""

    name = "Backtest report"
    operators = [ApprovalOperator, ReleaseApprovalOperator, RuleBacktestOperator]

    def get_link(self, operator, *, ti_key) -> str:  # type: ignore[no-untyped-def]
        return report_url(ti_key.dag_id, ti_key.run_id)


class RuleLifecyclePlugin(AirflowPlugin):
    name = "rule_lifecycle"
    fastapi_apps = [{"app": app, "url_prefix": REPORT_URL_PREFIX, "name": "Rule lifecycle reports"}]
    external_views = [
        {
            "name": "Backtest report",
            "href": report_href_template(),
            "destination": "dag_run",
            "url_route": "backtest-report",
        },
        {
            "name": "Backtest reports",
            "href": f"{REPORT_URL_PREFIX.lstrip('/')}/",
            "destination": "nav",
            "category": "browse",
            "url_route": "backtest-reports",
        },
        {
            "name": "Explain a detection",
            "href": f"{REPORT_URL_PREFIX.lstrip('/')}/detections/",
            "destination": "nav",
            "category": "browse",
            "url_route": "explain-detection",
        },
        {
            "name": "Shadow versions",
            "href": f"{REPORT_URL_PREFIX.lstrip('/')}/shadows/",
            "destination": "nav",
            "category": "browse",
            "url_route": "shadow-versions",
        },
    ]
    fastapi_root_middlewares = [
        {"middleware": FourEyesMiddleware, "name": "Four eyes on release approvals"},
        {"middleware": TriggerParamsMiddleware, "name": "Params allow-list at trigger time"},
    ]
    operator_extra_links = [BacktestReportLink()]
