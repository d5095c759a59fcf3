"""Hooks: the `rules.active` topic and Spark submission with a sensible local default."""

from __future__ import annotations

from typing import Any

from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.common.compat.sdk import AirflowNotFoundException


class RulesTopicHook(KafkaBaseHook):
    """Publish rules to, and read the live rule set from, the rules topic.

    Connection: an Apache Kafka connection (like the Kafka provider's hooks) whose extra
    holds `bootstrap.servers` and, on a broker with SASL, the `publisher` principal's
    `security.protocol`/`sasl.*` settings. When the connection does not exist the hook
    uses the `bootstrap` it was given and the process's Kafka settings
    (`spark_jobs.kafka.client_config`: `KAFKA_CREDENTIALS_FILE`, as `rulectl up` sets
    it), so the embedded setup works without any configuration.

    :param kafka_config_id: Airflow connection id of the Kafka cluster.
    :param bootstrap: fallback bootstrap servers when the connection is not defined.
    :param topic: the rules topic (default `rules.active`).
    """

    hook_name = "Rules topic (rule lifecycle)"

    def __init__(
        self,
        kafka_config_id: str = KafkaBaseHook.default_conn_name,
        *,
        bootstrap: str | None = None,
        topic: str = "rules.active",
        **kwargs: Any,
    ) -> None:
        super().__init__(kafka_config_id=kafka_config_id, **kwargs)
        self.fallback_bootstrap = bootstrap
        self.topic = topic

    def _connection(self) -> Any:
        try:
            return self.get_connection(self.kafka_config_id)
        except AirflowNotFoundException:
            return None

    @property
    def client_security(self) -> dict[str, Any] | None:
        """The connection's security settings (`security.*`, `sasl.*`, `ssl.*` of its
        extra), None without a connection: then the process's settings apply."""
        conn = self._connection()
        if conn is None:
            return None
        extra = conn.extra_dejson or {}
        return {k: v for k, v in extra.items() if k.split(".", 1)[0] in ("security", "sasl", "ssl")} or None

    @property
    def bootstrap(self) -> str:
        conn = self._connection()
        if conn is not None:
            servers = (conn.extra_dejson or {}).get("bootstrap.servers")
            if servers:
                return str(servers)
        if not self.fallback_bootstrap:
            raise ValueError(
                f"Kafka connection {self.kafka_config_id!r} has no bootstrap.servers and no fallback was given"
            )
        return self.fallback_bootstrap

    def current_rules(self) -> dict[str, dict]:
        """rule_id -> the newest rule document on the topic (what the live job runs)."""
        from spark_jobs.kafka.publisher import current_rules

        return current_rules(self.bootstrap, self.topic, client=self.client_security)

    def publish(self, rules: list[dict], *, published_by: str | None = None, commit: str | None = None) -> Any:
        """Produce the rules that differ from the live ones; returns PublishResult.

        The documents are parsed with the rule model first, so nothing the engine would
        reject can reach the topic through this hook.
        """
        from spark_jobs.kafka.publisher import publish_rules
        from spark_jobs.rules.model import parse_rule

        return publish_rules(
            [parse_rule(r) for r in rules], self.bootstrap, self.topic, published_by=published_by or None,
            commit=commit or None, client=self.client_security,
        )


class RuleSparkSubmitHook(SparkSubmitHook):
    """SparkSubmitHook that falls back to `default_master` (local) instead of YARN.

    The provider's hook assumes YARN when its connection is missing; the platform's
    default deployment runs Spark locally, so a missing connection means `local[2]`.
    A defined connection (e.g. `spark://spark-master:7077` in docker/) always wins.
    """

    def __init__(self, *args: Any, default_master: str = "local[2]", **kwargs: Any) -> None:
        self.default_master = default_master
        super().__init__(*args, **kwargs)

    def _resolve_connection(self) -> dict[str, Any]:
        data = super()._resolve_connection()
        try:
            self.get_connection(self._conn_id)
        except AirflowNotFoundException:
            self.log.info("No Spark connection %r: using master %s", self._conn_id, self.default_master)
            data["master"] = self.default_master
        return data


class AirflowApiHook:
    """Airflow's own REST API, as the release's service account.

    A task cannot change another DAG run (tasks do not touch the metadata DB); the
    public API can, under a user whose role allows exactly that (`Release service`:
    spark_jobs/platform/identity.py). The credentials are an Airflow connection
    (`rule_lifecycle_api`: host = the api-server's URL, login, password), kept in the
    secrets backend, never in code or params.
    """

    def __init__(self, conn_id: str = "rule_lifecycle_api") -> None:
        self.conn_id = conn_id

    def _conn(self) -> Any:
        from airflow.sdk import BaseHook

        return BaseHook.get_connection(self.conn_id)

    def available(self) -> bool:
        try:
            self._conn()
        except AirflowNotFoundException:
            return False
        return True

    def _call(self, method: str, path: str, body: object = None) -> dict:
        import json
        import urllib.request

        conn = self._conn()
        base = (conn.host or "").rstrip("/")
        if conn.port and f":{conn.port}" not in base.split("//", 1)[-1]:
            base = f"{base}:{conn.port}"
        req = urllib.request.Request(
            f"{base}/auth/token",
            data=json.dumps({"username": conn.login, "password": conn.password}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            token = json.loads(resp.read())["access_token"]
        req = urllib.request.Request(
            f"{base}{path}",
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else {}

    def set_note(self, dag_id: str, run_id: str, note: str) -> dict:
        """The run's note: shown in the grid and the run list, so a decision reads at a glance."""
        from urllib.parse import quote

        return self._call(
            "PATCH",
            f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}?update_mask=note",
            {"note": note[:1000]},
        )

    def end_run(self, dag_id: str, run_id: str, note: str, task_id: str = "approve") -> dict:
        """End a run that waits at `task_id`: that task fails (so the run fails and its
        approval is no longer asked), and the run's note says why."""
        from urllib.parse import quote

        run = f"/api/v2/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}"
        result = self._call("PATCH", f"{run}/taskInstances/{quote(task_id, safe='')}", {"new_state": "failed", "note": note[:1000]})
        self.set_note(dag_id, run_id, note)
        return result
