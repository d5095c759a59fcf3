"""Operators of the rule lifecycle."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.common.compat.sdk import AirflowSkipException, BaseOperator
from airflow.providers.standard.operators.hitl import ApprovalOperator

from rule_lifecycle.hooks import RuleSparkSubmitHook, RulesTopicHook
from spark_jobs.rules.model import shadow_id

if TYPE_CHECKING:
    from spark_jobs.lifecycle.settings import LifecycleSettings


class PublishRulesOperator(BaseOperator):
    """Publish rule documents to the rules topic (idempotent: live versions are skipped).

    :param rules: rule documents (canonical JSON dicts), e.g. an XComArg.
    :param kafka_config_id: Kafka connection id (see RulesTopicHook).
    :param bootstrap: fallback bootstrap servers when the connection is not defined.
    :param topic: the rules topic.
    :param published_by: who approved (a Kafka header on every produced record).
    :param commit: the rules commit (a Kafka header too).
    :param mode: "active", or "shadow" to release every rule as a shadow version beside
        the version in force (the approver's choice on the approval page); empty: as the
        rule files say.
    :return: {"published": [rule_id...], "unchanged": [rule_id...], "topic", "offsets":
        {rule_id: {"partition", "offset"}} of the records produced} (pushed to XCom).
    """

    template_fields: Sequence[str] = ("rules", "bootstrap", "topic", "kafka_config_id", "published_by", "commit", "mode")
    ui_color = "#e8f7e4"

    def __init__(
        self,
        *,
        rules: Any,
        kafka_config_id: str = "kafka_default",
        bootstrap: str | None = None,
        topic: str = "rules.active",
        published_by: str | None = None,
        commit: str | None = None,
        mode: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.mode = mode
        self.rules = rules
        self.kafka_config_id = kafka_config_id
        self.bootstrap = bootstrap
        self.topic = topic
        self.published_by = published_by
        self.commit = commit

    def execute(self, context: Any) -> dict:
        rules = list(self.rules or [])
        if self.mode == "shadow":
            rules = [{**r, "mode": "shadow"} for r in rules]
        elif self.mode not in (None, "", "active"):
            raise ValueError(f"mode must be 'active' or 'shadow', not {self.mode!r}")
        if not rules:
            self.log.info("No rules to publish.")
            return {"published": [], "unchanged": []}
        hook = RulesTopicHook(self.kafka_config_id, bootstrap=self.bootstrap, topic=self.topic)
        result = hook.publish(rules, published_by=self.published_by, commit=self.commit)
        published = sorted(_ids(getattr(result, "published", [])))
        unchanged = sorted(_ids(getattr(result, "unchanged", [])))
        for r in rules:
            live_id = shadow_id(r["rule_id"]) if r.get("mode") == "shadow" else r["rule_id"]
            state = "published" if live_id in published else "already live"
            self.log.info("%s version %s: %s", r["rule_id"], r.get("version"), state)
        offsets = result.to_dict().get("offsets", {}) if hasattr(result, "to_dict") else {}
        return {"published": published, "unchanged": unchanged, "topic": self.topic, "offsets": offsets,
                "mode": self.mode or "active"}


def _ids(items: Any) -> list[str]:
    out = []
    for x in items or []:
        if isinstance(x, str):
            out.append(x)
        elif isinstance(x, dict):
            out.append(x["rule_id"])
        else:
            out.append(getattr(x, "rule_id", str(x)))
    return out


class RuleBacktestOperator(SparkSubmitOperator):
    """Submit the backtest (`spark_jobs/backtest/submit.py`) with spark-submit, or run it
    on the platform's Spark Connect server when the plan names one.

    A thin SparkSubmitOperator: the application and its arguments come from a backtest
    plan (rules dir, `--only` rule ids, output dir, the server) and the history inputs,
    both usually XComArgs; the master comes from the Spark connection, or `local[2]`
    without one. With a server the same application runs as its client in the task's
    process (`spark_remote` in the lifecycle settings; decision 0003).
    Skips when the plan names no rule (e.g. the published side of a release of new rules).

    :param backtest: {"rules_dir", "out_dir", "only", "remote": a Spark Connect URL or None}.
    :param inputs: topic -> history path, or {"@archive": {"table", "from", "to"}} (a window of the
        event archive; `spark_jobs.lifecycle.release.backtest_args`).
    :param settings: lifecycle settings dict (time field, sink topic, Spark conf/master).
    """

    template_fields: Sequence[str] = (*SparkSubmitOperator.template_fields, "backtest", "inputs", "settings")
    ui_color = "#fdf2e0"

    def __init__(self, *, backtest: Any, inputs: Any, settings: Any, **kwargs: Any) -> None:
        # The application's path, found without importing it: the operator is built at
        # every parse of the DAG file, and the module imports PySpark and pandas (~0.8 s).
        application = importlib.util.find_spec("spark_jobs.backtest.submit").origin
        kwargs.setdefault("name", "rule-backtest")
        kwargs.setdefault("status_poll_interval", 2)
        super().__init__(application=application, **kwargs)
        self.backtest = backtest
        self.inputs = inputs
        self.settings = settings

    def execute(self, context: Any) -> dict:
        from spark_jobs.lifecycle.release import backtest_args
        from spark_jobs.lifecycle.settings import LifecycleSettings

        spec = dict(self.backtest)
        if not spec.get("only") and spec.get("require_only", True):
            raise AirflowSkipException("No rule to backtest on this side (nothing of it is live yet).")
        s = LifecycleSettings.from_dict(self.settings)
        shutil.rmtree(spec["out_dir"], ignore_errors=True)
        self.application_args = backtest_args(spec, self.inputs, s.time_field, s.sink_topic)
        if spec.get("remote"):
            self._run_on_server(spec["remote"])
        else:
            self._submit(context, s)
        summary_path = Path(spec["out_dir"]) / "summary.json"
        if not summary_path.exists():
            raise RuntimeError(f"the backtest wrote no {summary_path}")
        import json

        summary = json.loads(summary_path.read_text())
        self.log.info("Backtest: %s detection(s), %s dead letter(s)", summary.get("detections"), summary.get("dead_letter"))
        return {"out_dir": spec["out_dir"], "detections": summary.get("detections")}

    def _run_on_server(self, remote: str) -> None:
        """The backtest as a client of a running Spark Connect server, in this task's
        process. A spark-submit would start a driver JVM only to host the Python that
        talks to the server: a JVM start per backtest, the cost the warm server is there
        to save."""
        from spark_jobs.backtest.submit import main

        self._remote = remote
        self.log.info("Backtest on the Spark Connect server %s: %s", remote, " ".join(self.application_args))
        code = main(self.application_args)
        if code:
            raise RuntimeError(f"the backtest on {remote} failed (exit code {code}); its error is above")

    def on_kill(self) -> None:
        if getattr(self, "_remote", None):
            return  # the backtest ran in the task's own process: nothing else to stop
        super().on_kill()

    def _submit(self, context: Any, s: LifecycleSettings) -> None:
        """spark-submit of the backtest application through the provider's hook."""
        from spark_jobs.spark import jvm_options, submit_jars_and_conf

        jars, delta_conf = submit_jars_and_conf()
        # On the driver's class path from the start (a session cannot add them later).
        self.jars = ",".join(x for x in (self.jars, jars) if x)
        # The driver's JVM options too: the driver is this spark-submit's JVM, started
        # before the backtest's session is built.
        self.conf = jvm_options({**delta_conf, **s.spark_conf, **(self.conf or {})})
        self._conn_id = s.spark_conn_id
        bindir = str(Path(sys.executable).parent)
        self.env_vars = {
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "PATH": bindir + os.pathsep + os.environ.get("PATH", ""),
            **(self.env_vars or {}),
        }
        self._hook = self._make_hook(s.spark_master)
        if self._hook._connection["master"].startswith("local") and "SPARK_LOCAL_IP" not in self.env_vars:
            # A local job talks to itself only: keep Spark off the machine's network interfaces.
            self.env_vars["SPARK_LOCAL_IP"] = "127.0.0.1"
            self._hook = self._make_hook(s.spark_master)
        super().execute(context)

    def _make_hook(self, default_master: str) -> RuleSparkSubmitHook:
        """The provider's hook, with `default_master` instead of YARN when no connection exists."""
        return RuleSparkSubmitHook(
            default_master=default_master,
            conf=self.conf,
            conn_id=self._conn_id,
            name=self.name,
            status_poll_interval=self._status_poll_interval,
            application_args=self.application_args,
            env_vars=self.env_vars,
            verbose=self._verbose,
            spark_binary=self._spark_binary,
            driver_memory=self._driver_memory,
            executor_memory=self._executor_memory,
            py_files=self.py_files,
            files=self.files,
            jars=self.jars,
        )


class ReleaseApprovalOperator(ApprovalOperator):
    """The standard ApprovalOperator that also keeps the human's answer in XCom.

    On "Reject" the ApprovalOperator skips its downstream tasks by raising, so it returns
    no value; the release still has to record who rejected, when and why. The response
    (options, comment, user, time) is pushed under the XCom key `response` first, for
    both answers, and stated in the task log.
    """

    def validate_params_input(self, params_input: Any) -> None:
        """A response may leave fields out (their defaults apply: no comment, `release_as`
        active), as REST callers written before a field existed do; a field the form
        does not have, or a value its schema refuses, is still refused (the task fails:
        nothing is published)."""
        unknown = set(params_input or {}) - set(self.serialized_params.keys())
        if unknown:
            raise ValueError(f"params_input fields {sorted(unknown)} are not fields of this approval: "
                             f"{sorted(self.serialized_params.keys())}")
        for name, value in (params_input or {}).items():
            self.params.get_param(name).resolve(value)  # the field's schema (e.g. release_as's enum)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> Any:
        if "error" not in event:
            user = event.get("responded_by_user") or {}
            response = {
                "chosen_options": list(event.get("chosen_options") or []),
                "params_input": dict(event.get("params_input") or {}),
                "responded_at": event.get("responded_at"),
                "responded_by_user": dict(user),
            }
            context["ti"].xcom_push(key="response", value=response)
            comment = (response["params_input"] or {}).get("comment")
            self.log.info(
                "%s by %s%s", "/".join(response["chosen_options"]), user.get("name") or user.get("id"),
                f": {comment}" if comment else "",
            )
        return super().execute_complete(context, event)
