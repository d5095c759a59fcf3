"""Who may talk to the broker, and who may write `rules.active`: SASL/SCRAM + ACLs.

One principal per role of the platform, each with a generated password:

- `admin`: the broker itself (inter-broker) and topic/ACL administration (super user);
- `publisher`: the release path; the only principal that may WRITE `rules.active`;
- `detector`: the detection job; reads the source topics and `rules.active`, writes
  detections, dead letters and its status; may NOT write `rules.active`;
- `supervisor`: the detection supervisor (Airflow); reads the status and restart topics,
  writes restart requests to `detect.control`;
- `producer`: event sources (the demo generator, upstream services); writes the source
  topics only;
- `reader`: read-only consumers (`rulectl tail`, dashboards); reads every topic.

The detection job (`detector`) reads every topic too (a rule may name any source topic,
and Spark's pattern subscription silently skips topics it may not describe) and writes
only its outputs: detections, dead letters, status, its internal routing topic, and the
runner's restart records (the runner runs on the driver host under the same principal).

The client listener speaks SASL_PLAINTEXT with SCRAM-SHA-512 (credentials are stored
in KRaft's metadata, added when the log folder is formatted); the KRaft
`StandardAuthorizer` denies whatever no ACL allows. The controller listener stays
plaintext on the loopback address: it serves only the controller quorum of this one
node, so its anonymous principal is a super user there and nowhere else.

`EmbeddedBroker(security=BrokerSecurity.load_or_generate(FILE))` runs a broker like
that (`rulectl up` and `rulectl broker` do, with FILE under the work folder, mode 0600);
clients find their password in the same file through `spark_jobs.kafka.client_config`,
the one place client configurations are built.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

MECHANISM = "SCRAM-SHA-512"
RULES_TOPIC = "rules.active"
USERS = ("admin", "publisher", "detector", "supervisor", "producer", "reader")
ALL = "*"  # an ACL on every topic (a literal "*" resource name in Kafka)

# librdkafka's own log lines of the admin clients here (a background queue purged at
# close) are noise on a user's terminal: routed to a logger that drops them.
_QUIET = logging.getLogger("spark_jobs.kafka.security.admin")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False


@dataclass
class BrokerSecurity:
    """Users (name -> password) and the topics each role reads and writes."""

    passwords: dict[str, str]
    admin: str = "admin"
    rules_topic: str = RULES_TOPIC
    detector_writes: tuple[str, ...] = ("events.processed", "events.shadow", "events.deadletter", "detect.status", "detect.restarts",
                                        "detect.warmup")
    supervisor_reads: tuple[str, ...] = ("detect.status", "detect.restarts", "detect.control")
    supervisor_writes: tuple[str, ...] = ("detect.control",)
    producer_writes: tuple[str, ...] = ("events.raw", "context.raw")
    extra_acls: list[tuple[str, str, str]] = field(default_factory=list)  # (user, operation, topic)

    @classmethod
    def generate(cls, **kwargs: object) -> BrokerSecurity:
        return cls(passwords={u: secrets.token_urlsafe(18) for u in USERS}, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def load_or_generate(cls, path: str | Path, **kwargs: object) -> BrokerSecurity:
        """The users of `path` (JSON `{principal: password}`, mode 0600), generated and
        written on first use; a principal missing from an older file is added (the
        broker stores it at its next start, `ensure_users`). Never printed."""
        from spark_jobs.platform.identity import write_secret_file

        f = Path(path)
        kept: dict[str, str] = {}
        if f.exists():
            data = json.loads(f.read_text(encoding="utf-8") or "{}")
            if not isinstance(data, dict):
                raise ValueError(f"{f}: expected a JSON object of principal -> password")
            kept = {str(k): str(v) for k, v in data.items()}
        passwords = {**{u: secrets.token_urlsafe(18) for u in USERS if u not in kept}, **kept}
        if passwords != kept or (f.stat().st_mode & 0o077):
            write_secret_file(f, passwords)  # (re)written 0600 even if someone loosened it
        return cls(passwords=passwords, **kwargs)  # type: ignore[arg-type]

    # ------------------------------------------------------------------ broker side
    def server_properties(self, host: str, port: int, controller_port: int) -> dict[str, str]:
        admin_pw = self.passwords[self.admin]
        return {
            "listeners": f"SASL_PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
            "advertised.listeners": f"SASL_PLAINTEXT://{host}:{port}",
            "inter.broker.listener.name": "SASL_PLAINTEXT",
            "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT",
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            f"listener.name.sasl_plaintext.{MECHANISM.lower()}.sasl.jaas.config": (
                "org.apache.kafka.common.security.scram.ScramLoginModule required "
                f'username="{self.admin}" password="{admin_pw}";'
            ),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{self.admin};User:ANONYMOUS",
        }

    def format_args(self) -> list[str]:
        """`StorageTool format` arguments that store every user's SCRAM credentials."""
        out: list[str] = []
        for user, pw in self.passwords.items():
            out += ["--add-scram", f"{MECHANISM}=[name={user},password={pw}]"]
        return out

    def acls(self) -> list[tuple[str, str, str, str]]:
        """(user, operation, resource type, name) allowed; everything else is denied."""
        rows = [("publisher", "WRITE", "TOPIC", self.rules_topic), ("publisher", "DESCRIBE", "TOPIC", self.rules_topic),
                ("publisher", "IDEMPOTENT_WRITE", "BROKER", "kafka-cluster")]
        rows += [("publisher", "READ", "TOPIC", self.rules_topic)]  # idempotent publishing reads what is live
        # Reading every topic (ALL) is granted to the job and to read-only consumers;
        # writing is granted topic by topic, and nobody but the publisher (and the
        # admin, a super user) has WRITE on the rules topic.
        for user in ("detector", "reader"):
            rows += [(user, "READ", "TOPIC", ALL), (user, "DESCRIBE", "TOPIC", ALL)]
        for t in self.detector_writes:
            rows += [("detector", "WRITE", "TOPIC", t), ("detector", "DESCRIBE", "TOPIC", t)]
        for t in self.supervisor_reads:
            rows += [("supervisor", "READ", "TOPIC", t), ("supervisor", "DESCRIBE", "TOPIC", t)]
        for t in self.supervisor_writes:
            rows += [("supervisor", "WRITE", "TOPIC", t), ("supervisor", "DESCRIBE", "TOPIC", t)]
        for t in self.producer_writes:
            rows += [("producer", "WRITE", "TOPIC", t), ("producer", "DESCRIBE", "TOPIC", t)]
        for user in ("publisher", "detector", "supervisor", "producer", "reader"):
            rows.append((user, "READ", "GROUP", ALL))
        rows += [(u, op, "TOPIC", t) for u, op, t in self.extra_acls]
        return list(dict.fromkeys(rows))  # the admin API refuses duplicate bindings

    def apply_acls(self, bootstrap: str, timeout: float = 30.0) -> None:
        """Create the ACLs (as the admin): idempotent."""
        from confluent_kafka.admin import (
            AclBinding,
            AclOperation,
            AclPermissionType,
            AdminClient,
            ResourcePatternType,
            ResourceType,
        )

        admin = AdminClient({"bootstrap.servers": bootstrap, "logger": _QUIET, **self.client_config(self.admin)})
        bindings = []
        for user, op, rtype, name in self.acls():
            literal = name != "*"
            bindings.append(AclBinding(
                ResourceType[rtype], name if literal else "*",
                ResourcePatternType.LITERAL, f"User:{user}", "*", AclOperation[op], AclPermissionType.ALLOW,
            ))
        for fut in admin.create_acls(bindings, request_timeout=timeout).values():
            fut.result(timeout)

    def ensure_users(self, bootstrap: str, timeout: float = 30.0) -> None:
        """Store every user's SCRAM credentials (as the admin): idempotent. Users are
        also stored when the log is formatted; this adds the ones a credentials file
        gained later, and makes the file the truth after a password change."""
        from confluent_kafka.admin import (
            AdminClient,
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        admin = AdminClient({"bootstrap.servers": bootstrap, "logger": _QUIET, **self.client_config(self.admin)})
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
        ups = [UserScramCredentialUpsertion(u, info, pw.encode()) for u, pw in self.passwords.items()
               if u != self.admin]
        for fut in admin.alter_user_scram_credentials(ups, request_timeout=timeout).values():
            fut.result(timeout)

    # ------------------------------------------------------------------ client side
    def client_config(self, user: str) -> dict[str, str]:
        return client_config(user, self.passwords[user])


def client_config(user: str, password: str) -> dict[str, str]:
    """confluent-kafka settings of a SCRAM client (spark_jobs.kafka.client_config builds
    them from the platform's settings; this is the raw form)."""
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": MECHANISM,
        "sasl.username": user,
        "sasl.password": password,
    }


def jaas(user: str, password: str) -> Mapping[str, str]:
    """The same for a JVM client (Spark's Kafka connector: prefix each key with `kafka.`).

    JAAS quotes values with `"` and escapes with `\\`: both are escaped, so a password
    cannot end the value and add options of its own."""

    def q(text: str) -> str:
        return text.replace("\\", "\\\\").replace('"', '\\"')

    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": MECHANISM,
        "sasl.jaas.config": (
            f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{q(user)}" '
            f'password="{q(password)}";'
        ),
    }
