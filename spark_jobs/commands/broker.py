"""`rulectl broker`: run the embedded Apache Kafka broker (KRaft) in the foreground.

The one-machine setup (and a developer's terminal) needs a broker without Docker: this
starts Kafka from its Maven jars with its log in `--data-dir` (kept across restarts),
creates the platform's topics, prints the bootstrap address and stays up until Ctrl-C /
SIGTERM, then stops the broker cleanly.

Like `rulectl up`, it runs Kafka with SASL/SCRAM users and ACLs (spark_jobs/kafka/security.py):
the principals' passwords are generated once into `--credentials-file` (default
`kafka-credentials.json` beside the data folder, mode 0600, never printed); clients
find theirs with `KAFKA_CREDENTIALS_FILE=<that file>`. `--insecure` runs it without
users and ACLs: development only, never in production.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from spark_jobs.commands.signals import serve
from spark_jobs.kafka.broker import PLATFORM_TOPICS, BrokerError, EmbeddedBroker
from spark_jobs.kafka.security import BrokerSecurity


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("broker", help="run the embedded Apache Kafka broker (KRaft) until Ctrl-C")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=9092, help="listen port (default: 9092)")
    p.add_argument("--partitions", type=int, default=1, help="partitions per data topic (default: 1)")
    p.add_argument("--data-dir", default="var/kafka", help="the broker's log folder, kept across restarts (default: var/kafka)")
    p.add_argument("--brokers", type=int, default=1,
                   help="KRaft nodes on ports PORT, PORT+1, ... (default 1); 3: a cluster with replication factor 3 "
                        "and min.insync.replicas 2, every node broker and controller, node i under DATA_DIR/node-i")
    p.add_argument("--controller-port", type=int, default=19092,
                   help="with --brokers > 1: first controller (quorum) port (default: 19092)")
    p.add_argument("--credentials-file", default=None,
                   help="the principals' passwords (JSON, 0600; generated when missing; default: "
                        "DATA_DIR/../kafka-credentials.json)")
    p.add_argument("--insecure", action="store_true",
                   help="development only, not for production: no SASL users and no ACLs (any client may "
                        "write rules.active)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.partitions < 1:
        print("rulectl broker: --partitions must be at least 1", file=sys.stderr)
        return 2
    if args.brokers < 1:
        print("rulectl broker: --brokers must be at least 1", file=sys.stderr)
        return 2
    security = _security(args)
    if args.brokers > 1:
        return _run_cluster(args, security)
    broker = EmbeddedBroker(port=args.port, host=args.host, topics=PLATFORM_TOPICS, partitions=args.partitions,
                            data_dir=args.data_dir, security=security)
    return serve(
        "rulectl broker", broker, (BrokerError,),
        lambda: [f"broker ready on {broker.bootstrap} (pid {broker.pid}, log in {broker.data_dir})",
                 f"topics: {', '.join(PLATFORM_TOPICS)}", _security_line(args)],
        lambda: None if broker.is_running() else "the broker process exited unexpectedly",
        "broker",
    )


def credentials_file(args: argparse.Namespace) -> Path:
    return Path(args.credentials_file) if args.credentials_file else Path(args.data_dir).parent / "kafka-credentials.json"


def _security(args: argparse.Namespace) -> BrokerSecurity | None:
    return None if args.insecure else BrokerSecurity.load_or_generate(credentials_file(args))


def _security_line(args: argparse.Namespace) -> str:
    if args.insecure:
        return "INSECURE: no SASL users, no ACLs (--insecure: development only)"
    return (f"SASL/SCRAM + ACLs: passwords in {credentials_file(args)} (owner only); clients: "
            f"KAFKA_CREDENTIALS_FILE={credentials_file(args)}")


def _run_cluster(args: argparse.Namespace, security: BrokerSecurity | None = None) -> int:
    """`--brokers N`: N KRaft nodes in the foreground; any node that dies is reported,
    and the command stops (all nodes) only on Ctrl-C/SIGTERM, because a cluster with one
    node down still serves (that is what it is for), and a test or an operator restarts
    the node."""
    from spark_jobs.kafka.cluster import KafkaCluster

    cluster = KafkaCluster(args.data_dir, size=args.brokers, host=args.host, port=args.port,
                           controller_port=args.controller_port, partitions=args.partitions, security=security)
    reported: set[int] = set()

    def failure() -> str | None:
        nonlocal reported
        down = {n.node_id for n in cluster.nodes if not n.is_running()}
        for node_id in sorted(down - reported):
            print(f"rulectl broker: node {node_id} exited", file=sys.stderr, flush=True)
        reported = down
        return "every node exited" if len(down) == len(cluster.nodes) else None

    def announce() -> list[str]:
        pids = ", ".join(f"node {n.node_id} pid {n.pid}" for n in cluster.nodes)
        return [f"cluster ready on {cluster.bootstrap} ({pids}; logs in {cluster.data_dir})",
                f"topics (replication {cluster.replication}): {', '.join(cluster.topics)}", _security_line(args)]

    return serve("rulectl broker", cluster, (BrokerError,), announce, failure, "cluster")
