"""rule_release's backtests run on the configured Spark cluster: a real standalone master
with two workers, Airflow on PostgreSQL, the provider's SparkSubmitOperator submitting
to `spark://...`; the master's own application list shows the backtests."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from airflow_fixtures import ROOT, AirflowEnv, airflow_env  # noqa: F401
from cluster_helpers import free_block

from spark_jobs.platform.spark_cluster import LocalSparkCluster

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.kafka, pytest.mark.slow]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout.strip()


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=Rita Author", "-c", "user.email=rita@example.com", "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def test_release_backtests_are_applications_of_the_cluster(airflow_env: AirflowEnv, kafka_broker,  # noqa: F811
                                                           tmp_path: Path) -> None:
    from spark_jobs.kafka.publisher import publish_rules
    from spark_jobs.rules.loader import load_rules

    af = airflow_env
    repo = tmp_path / "rules-repo"
    (repo / "rules").mkdir(parents=True)
    shutil.copy(ROOT / "rules" / "rapid_clicks.yaml", repo / "rules" / "rapid_clicks.yaml")
    git(repo, "init", "-q", "-b", "main")
    c0 = commit_all(repo, "Initial rule set")
    topic = f"rules.active.{uuid.uuid4().hex[:8]}"
    publish_rules([lr.rule for lr in load_rules([repo / "rules"]).rules], kafka_broker.bootstrap, topic,
                  published_by="bootstrap", commit=c0)
    text = (repo / "rules" / "rapid_clicks.yaml").read_text()
    (repo / "rules" / "rapid_clicks.yaml").write_text(
        text.replace('version: "1"', 'version: "2"').replace("threshold: 10", "threshold: 8"))
    c1 = commit_all(repo, "rapid_clicks: 8 clicks")

    port = free_block(1)
    ui = free_block(3, port + 50)
    with LocalSparkCluster(tmp_path / "spark", workers=2, port=port, webui_port=ui) as spark:
        settings = {
            "repo": str(repo), "branch": "main", "state_dir": str(tmp_path / "state"),
            "bootstrap": kafka_broker.bootstrap, "rules_topic": topic,
            "history_inputs": {"events.raw": str(ROOT / "tests" / "data" / "demo" / "events.raw.jsonl"),
                               "context.raw": str(ROOT / "tests" / "data" / "demo" / "context.raw.jsonl")},
            # The configured cluster: what an operator sets to move backtests off Airflow.
            "spark_master": spark.master_url,
        }
        af.request("DELETE", "/api/v2/variables/rule_lifecycle")
        af.api("POST", "/variables", {"key": "rule_lifecycle", "value": json.dumps(settings)})
        try:
            run = af.start_dag_test("rule_release", conf={"commit": c1}, log_name="release-on-cluster")
            detail = af.wait_for_hitl("rule_release", run, timeout=600)
            run_id = detail["task_instance"]["dag_run_id"]
            states = af.task_states("rule_release", run_id)
            assert states["backtest_candidate"] == "success" and states["backtest_published"] == "success", states
            apps = spark.state()
            finished = [a["name"] for a in apps.get("completedapps", [])]
            assert finished == ["rulectl-backtest"] * 2, apps  # candidate and published, on the cluster
            assert all(a.get("state") == "FINISHED" for a in apps["completedapps"])
            af.respond(detail, "Reject", comment="only testing where the backtest runs")
            run.wait()
        finally:
            af.stop_runs()
            af.request("DELETE", "/api/v2/variables/rule_lifecycle")
