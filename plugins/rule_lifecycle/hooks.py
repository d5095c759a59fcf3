"""Hooks: the `rules.active` topic and Spark submission with a sensible local default."""

from __future__ import annotations

from typing import Any

from airflow.providers.apache.kafka.hooks.base import KafkaBaseHook
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.common.compat.sdk import AirflowNotFoundException


class RulesTopicHook(KafkaBaseHook):
    """Publish rules to, and read the live rule set from, the rules topic.

    Connection: an Apache Kafka connection (like the Kafka provider's hooks) whose extra
    holds `bootstrap.servers`. When the connection does not exist the hook uses the
    `bootstrap` it was given, so the embedded setup works without any configuration.

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

    @property
    def bootstrap(self) -> str:
        try:
            conn = self.get_connection(self.kafka_config_id)
        except AirflowNotFoundException:
            conn = None
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

        return current_rules(self.bootstrap, self.topic)

    def publish(self, rules: list[dict], *, published_by: str | None = None, commit: str | None = None) -> Any:
        """Produce the rules that differ from the live ones; returns PublishResult.

        The documents are parsed with the rule model first, so nothing the engine would
        reject can reach the topic through this hook.
        """
        from spark_jobs.kafka.publisher import publish_rules
        from spark_jobs.rules.model import parse_rule

        return publish_rules(
            [parse_rule(r) for r in rules], self.bootstrap, self.topic, published_by=published_by or None, commit=commit or None
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
