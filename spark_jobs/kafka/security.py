"""Who may talk to the broker, and who may write `rules.active`: SASL/SCRAM + ACLs.

One principal per role of the platform, each with a generated password:

- `admin`: the broker itself (inter-broker) and topic/ACL administration (super user);
- `publisher`: the release path; the only principal that may WRITE `rules.active`;
- `detector`: the detection job; reads the source topics and `rules.active`, writes
  detections, dead letters and its status; may NOT write `rules.active`;
- `supervisor`: the detection supervisor; reads the status topic;
- `reader`: read-only consumers (`rulectl tail`, dashboards).

The client listener speaks SASL_PLAINTEXT with SCRAM-SHA-512 (credentials are stored
in KRaft's metadata, added when the log folder is formatted); the KRaft
`StandardAuthorizer` denies whatever no ACL allows. The controller listener stays
plaintext on the loopback address: it serves only the controller quorum of this one
node, so its anonymous principal is a super user there and nowhere else.

`EmbeddedBroker(security=BrokerSecurity.generate())` runs a broker like that;
`client_config(user)` is what a confluent-kafka client of that user adds to its config.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

MECHANISM = "SCRAM-SHA-512"
RULES_TOPIC = "rules.active"
USERS = ("admin", "publisher", "detector", "supervisor", "reader")


@dataclass
class BrokerSecurity:
    """Users (name -> password) and the topics each role reads and writes."""

    passwords: dict[str, str]
    admin: str = "admin"
    rules_topic: str = RULES_TOPIC
    detector_reads: tuple[str, ...] = ("events.raw", "context.raw", RULES_TOPIC)
    detector_writes: tuple[str, ...] = ("events.processed", "events.deadletter", "detect.status")
    reader_topics: tuple[str, ...] = ("events.processed", "events.deadletter", "detect.status", RULES_TOPIC)
    extra_acls: list[tuple[str, str, str]] = field(default_factory=list)  # (user, operation, topic)

    @classmethod
    def generate(cls, **kwargs: object) -> BrokerSecurity:
        return cls(passwords={u: secrets.token_urlsafe(18) for u in USERS}, **kwargs)  # type: ignore[arg-type]

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
        for t in self.detector_reads:
            rows += [("detector", "READ", "TOPIC", t), ("detector", "DESCRIBE", "TOPIC", t)]
        for t in self.detector_writes:
            rows += [("detector", "WRITE", "TOPIC", t), ("detector", "DESCRIBE", "TOPIC", t)]
        rows += [("supervisor", "READ", "TOPIC", "detect.status"), ("supervisor", "DESCRIBE", "TOPIC", "detect.status")]
        for t in self.reader_topics:
            rows += [("reader", "READ", "TOPIC", t), ("reader", "DESCRIBE", "TOPIC", t)]
        for user in ("publisher", "detector", "supervisor", "reader"):
            rows.append((user, "READ", "GROUP", "*"))
        rows += [(u, op, "TOPIC", t) for u, op, t in self.extra_acls]
        return rows

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

        admin = AdminClient({"bootstrap.servers": bootstrap, **self.client_config(self.admin)})
        bindings = []
        for user, op, rtype, name in self.acls():
            literal = name != "*"
            bindings.append(AclBinding(
                ResourceType[rtype], name if literal else "*",
                ResourcePatternType.LITERAL, f"User:{user}", "*", AclOperation[op], AclPermissionType.ALLOW,
            ))
        for fut in admin.create_acls(bindings, request_timeout=timeout).values():
            fut.result(timeout)

    # ------------------------------------------------------------------ client side
    def client_config(self, user: str) -> dict[str, str]:
        return client_config(user, self.passwords[user])


def client_config(user: str, password: str) -> dict[str, str]:
    """confluent-kafka settings of a SCRAM client."""
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": MECHANISM,
        "sasl.username": user,
        "sasl.password": password,
    }


def jaas(user: str, password: str) -> Mapping[str, str]:
    """The same for a JVM client (Spark's Kafka connector: prefix each key with `kafka.`)."""
    return {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": MECHANISM,
        "sasl.jaas.config": (
            f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{user}" password="{password}";'
        ),
    }
