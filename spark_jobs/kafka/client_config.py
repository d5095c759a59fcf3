"""The one place where Kafka clients of the platform get their security settings.

Every client talks to the broker as one principal of `spark_jobs.kafka.security`
(publisher, detector, supervisor, producer, reader; admin for topics and ACLs). The
call site says which role it plays; the settings say how that role authenticates:

| environment variable        | meaning                                                      |
|-----------------------------|--------------------------------------------------------------|
| `KAFKA_CREDENTIALS_FILE`    | JSON `{principal: password}` (mode 0600; `rulectl up` writes `var/kafka-credentials.json`, docker/ mounts a secret holding only the principals of its container). Set: SASL/SCRAM. Unset: no credentials (a plaintext broker, `--insecure`). |
| `KAFKA_PRINCIPAL`           | use this principal whatever role the call site plays (one identity per host or container, or an operator's `KAFKA_PRINCIPAL=admin rulectl tail ...`) |
| `KAFKA_SECURITY_PROTOCOL`   | default `SASL_PLAINTEXT` with credentials (`SASL_SSL` behind TLS), `PLAINTEXT` without |
| `KAFKA_SASL_MECHANISM`      | default `SCRAM-SHA-512`                                      |

Two functions build client configurations from them, so no call site copies a
security setting: `confluent_config(role)` for confluent-kafka (librdkafka) producers,
consumers and admin clients, and `spark_options(role)` for Spark's JVM Kafka connector
(`kafka.`-prefixed options with a JAAS line). Settings resolve like the platform's other
settings (`spark_jobs.layered_settings`: defaults < environment < explicit overrides).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from spark_jobs import layered_settings
from spark_jobs.kafka.security import MECHANISM, jaas

ENV_PREFIX = "KAFKA_"
CREDENTIALS_ENV = "KAFKA_CREDENTIALS_FILE"

ROLES = ("admin", "publisher", "detector", "supervisor", "producer", "reader")


class KafkaAuthError(RuntimeError):
    """The settings ask for credentials that are not there (no file, no such principal)."""


@dataclass(frozen=True)
class KafkaClientSettings:
    """How this process's Kafka clients authenticate (see the module docstring)."""

    credentials_file: str = ""
    principal: str = ""
    security_protocol: str = ""
    sasl_mechanism: str = MECHANISM

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: str) -> KafkaClientSettings:
        """Defaults < `KAFKA_*` environment < `overrides` (None values do not count)."""
        merged = layered_settings.env_settings(cls, ENV_PREFIX, environ)
        merged.update({k: v for k, v in overrides.items() if v is not None})
        return layered_settings.from_dict(cls, merged, "kafka client")

    @property
    def secured(self) -> bool:
        return bool(self.credentials_file)

    def user_for(self, role: str | None) -> str | None:
        return self.principal or role

    def password(self, user: str) -> str:
        """`user`'s password from the credentials file (read at each call: the file is
        the truth, and a password never sits in an environment variable)."""
        path = Path(self.credentials_file)
        try:
            data = json.loads(path.read_text(encoding="utf-8") or "{}")
        except FileNotFoundError as exc:
            raise KafkaAuthError(f"Kafka credentials file {path} not found ({CREDENTIALS_ENV})") from exc
        except (OSError, ValueError) as exc:
            raise KafkaAuthError(f"Kafka credentials file {path} unreadable: {type(exc).__name__}") from exc
        if not isinstance(data, dict) or not isinstance(data.get(user), str):
            raise KafkaAuthError(f"no password for Kafka principal {user!r} in {path}")
        return str(data[user])

    def protocol(self) -> str:
        return self.security_protocol or ("SASL_PLAINTEXT" if self.secured else "PLAINTEXT")


PLATFORM_STATE_ENV = "RULES_PLATFORM_STATE"
DEFAULT_PLATFORM_STATE = Path("var") / "platform.json"


def platform_credentials_file(environ: Mapping[str, str] | None = None) -> str | None:
    """The credentials file of the platform `rulectl up` runs, found from its state file
    ($RULES_PLATFORM_STATE, else `var/platform.json` under the current folder, where
    `make up` keeps it). None when no platform runs here or it runs without SASL
    (`--insecure`), so a plain broker elsewhere is not offered a password."""
    env = os.environ if environ is None else environ
    state = Path(env.get(PLATFORM_STATE_ENV) or DEFAULT_PLATFORM_STATE)
    try:
        found = json.loads(state.read_text(encoding="utf-8")).get("kafka_credentials_file")
    except (OSError, ValueError, AttributeError):
        return None
    return found if isinstance(found, str) and Path(found).is_file() else None


def adopt_platform_credentials() -> str | None:
    """Let a command in the user's shell (`rulectl tail ...` next to `make up`) act as
    its role without being told where the credentials are: set `KAFKA_CREDENTIALS_FILE`
    to the local platform's file when it is unset. An explicit setting always wins."""
    if os.environ.get(CREDENTIALS_ENV):
        return None
    found = platform_credentials_file()
    if found:
        os.environ[CREDENTIALS_ENV] = found
    return found


def settings(environ: Mapping[str, str] | None = None) -> KafkaClientSettings:
    """This process's settings (environment)."""
    return KafkaClientSettings.from_env(os.environ if environ is None else environ)


def confluent_config(role: str | None, kafka: KafkaClientSettings | None = None) -> dict[str, str]:
    """The security part of a confluent-kafka client config of `role` (merge it with
    `bootstrap.servers` and the client's own settings). Empty without credentials, so a
    plaintext broker keeps working unchanged. `role` None: only `KAFKA_PRINCIPAL` names
    a user (a helper that does not know who calls it)."""
    s = kafka or settings()
    user = s.user_for(role)
    if not s.secured or not user:
        return {"security.protocol": s.security_protocol} if s.security_protocol else {}
    return {
        "security.protocol": s.protocol(),
        "sasl.mechanism": s.sasl_mechanism,
        "sasl.username": user,
        "sasl.password": s.password(user),
    }


def spark_options(role: str | None, kafka: KafkaClientSettings | None = None) -> dict[str, str]:
    """The same for Spark's Kafka connector (`spark-sql-kafka-0-10`): `kafka.`-prefixed
    options, the credentials as a SCRAM JAAS line (`kafka.sasl.jaas.config`, which
    Spark redacts in plans and UIs: `spark_jobs.spark.REDACTION_REGEX`)."""
    s = kafka or settings()
    user = s.user_for(role)
    if not s.secured or not user:
        return {"kafka.security.protocol": s.security_protocol} if s.security_protocol else {}
    scram = jaas(user, s.password(user))
    return {
        "kafka.security.protocol": s.protocol(),
        "kafka.sasl.mechanism": s.sasl_mechanism,
        "kafka.sasl.jaas.config": scram["sasl.jaas.config"],
    }


def with_bootstrap(bootstrap: str, role: str | None, extra: Mapping[str, object] | None = None,
                   kafka: KafkaClientSettings | None = None) -> dict[str, object]:
    """`{"bootstrap.servers": bootstrap, <security of role>, <extra>}`: a whole
    confluent-kafka config; `extra` wins (a test's explicit credentials)."""
    return {"bootstrap.servers": bootstrap, **confluent_config(role, kafka), **dict(extra or {})}
