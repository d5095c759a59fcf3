"""One-shot init of the docker/ stack: create the platform's topics, publish the rules.

Runs as the `platform-init` service once Kafka is healthy, before the detection job
starts (the job expects `rules.active` to hold the rule set). Idempotent: existing
topics are left as they are and publishing skips rules already live, so `docker compose
up` can run it on every start.

With SASL (KAFKA_CREDENTIALS_FILE holding every principal, the kafka_credentials
secret): as the admin it stores the other principals' SCRAM credentials (the nodes
stored the admin's at format time) and the ACLs, creates the topics; then it publishes
as `publisher`, the only principal the ACLs let write `rules.active`.

Environment: KAFKA_BOOTSTRAP (kafka:19092), PARTITIONS (3, for the data topics; control
topics always get one), REPLICATION (1; 3 on the three-broker cluster: then
min.insync.replicas 2), RULES_DIR (/opt/rule-platform/rules), WAIT_SECONDS (120),
KAFKA_CREDENTIALS_FILE (unset: a broker without SASL).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from spark_jobs.kafka.admin import create_topics
from spark_jobs.kafka.broker import topic_specs
from spark_jobs.kafka.client_config import settings as kafka_settings
from spark_jobs.kafka.cluster import CLUSTER_TOPICS
from spark_jobs.kafka.publisher import publish_rules
from spark_jobs.rules.loader import load_rules


def main() -> int:
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP", "kafka:19092")
    partitions = int(os.environ.get("PARTITIONS", "3"))
    replication = int(os.environ.get("REPLICATION", "1"))
    rules_dir = os.environ.get("RULES_DIR", "/opt/rule-platform/rules")
    wait_s = float(os.environ.get("WAIT_SECONDS", "120"))

    loaded = load_rules([rules_dir])
    if loaded.errors:
        for err in loaded.errors:
            print(f"ERROR {err}", file=sys.stderr)
        print(
            f"init: {len(loaded.errors)} invalid rule(s) in {rules_dir}; nothing published", file=sys.stderr
        )
        return 1

    kafka = kafka_settings()
    security = None
    if kafka.secured:
        from spark_jobs.kafka.security import BrokerSecurity

        security = BrokerSecurity(passwords=json.loads(Path(kafka.credentials_file).read_text()))
    deadline = time.monotonic() + wait_s
    while True:  # the healthcheck says the broker is up; metadata may still settle
        try:
            if security is not None:
                security.ensure_users(bootstrap)
            created = create_topics(bootstrap, topic_specs(CLUSTER_TOPICS, partitions, replication), timeout=15.0,
                                    role="admin")
            if security is not None:
                security.apply_acls(bootstrap)
            break
        except Exception as exc:  # KafkaException / RuntimeError while the broker starts
            if time.monotonic() > deadline:
                print(f"init: cannot create topics on {bootstrap}: {exc}", file=sys.stderr)
                return 1
            time.sleep(2.0)
    print(
        f"init: topics on {bootstrap}: {', '.join(CLUSTER_TOPICS)} (created: {', '.join(created) or 'none'})"
    )

    result = publish_rules([lr.rule for lr in loaded.rules], bootstrap, published_by="docker-init")
    print(
        f"init: {len(result.published)} rule(s) published, {len(result.unchanged)} unchanged on {result.topic}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
