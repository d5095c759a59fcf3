"""A Kafka cluster on one machine: N KRaft nodes on loopback ports, for trying scale-out.

Each node is broker and controller in one JVM (an `EmbeddedBroker` with a node id) and
the controllers form a static quorum (`controller.quorum.voters`), so with three nodes
any one may die and the cluster keeps a controller majority and two in-sync replicas
of every partition. Topics get replication factor N (at most 3) and
`min.insync.replicas` N - 1: an `acks=all` write is acknowledged only when two copies
have it, so losing one broker loses nothing that was acknowledged.

Node i keeps its log in `data_dir/node-i`, listens for clients on `port + i - 1` and for
its peers' controllers on `controller_port + i - 1`; the ports and the cluster id are
recorded in `data_dir/cluster.json` at the first start, because the formatted logs name
them.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

from spark_jobs.kafka.admin import create_topics
from spark_jobs.kafka.broker import DEFAULT_TOPICS, BrokerError, EmbeddedBroker, new_cluster_id, topic_specs
from spark_jobs.kafka.security import BrokerSecurity

# The control topics are created up front too, so they are replicated like
# the rest instead of being created with whatever the broker defaults to.
CLUSTER_TOPICS: tuple[str, ...] = (*DEFAULT_TOPICS, "detect.control", "detect.restarts")


class KafkaCluster:
    """`size` KRaft nodes (combined broker + controller) on host:port..port+size-1.

    Use as a context manager or call start()/stop(). `node(i)` gives node i (1-based)
    for tests that kill and restart one.
    """

    def __init__(
        self,
        data_dir: str | Path,
        size: int = 3,
        host: str = "127.0.0.1",
        port: int = 9092,
        controller_port: int = 19092,
        topics: Iterable[str] | None = CLUSTER_TOPICS,
        partitions: int | Mapping[str, int] = 1,
        startup_timeout: float = 90.0,
        security: BrokerSecurity | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"a cluster needs at least one node, not {size}")
        self.data_dir = Path(data_dir)
        self.size = size
        self.host = host
        self.topics = tuple(topics or ())
        self.partitions = partitions
        self.replication = min(3, size)
        # SASL/SCRAM users and ACLs on every node (spark_jobs/kafka/security.py); None: open.
        self.security = security
        layout = self._layout(port, controller_port)
        voters = ",".join(f"{i + 1}@{host}:{c}" for i, c in enumerate(layout["controller_ports"]))
        self.nodes = [
            EmbeddedBroker(
                port=p, host=host, topics=(), data_dir=self.data_dir / f"node-{i + 1}",
                controller_port=c, node_id=i + 1, quorum_voters=voters, cluster_id=layout["cluster_id"],
                replication=self.replication, startup_timeout=startup_timeout, security=security,
            )
            for i, (p, c) in enumerate(zip(layout["ports"], layout["controller_ports"], strict=True))
        ]

    def _layout(self, port: int, controller_port: int) -> dict:
        """Ports and cluster id: those of the first start when the folder has them."""
        saved = self.data_dir / "cluster.json"
        if saved.is_file():
            layout = json.loads(saved.read_text())
            if len(layout["ports"]) != self.size:
                raise BrokerError(f"{self.data_dir} holds a {len(layout['ports'])}-node cluster, not {self.size}")
            return layout
        layout = {
            "cluster_id": new_cluster_id(),
            "ports": [port + i for i in range(self.size)],
            "controller_ports": [controller_port + i for i in range(self.size)],
        }
        self.data_dir.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps(layout, indent=2))
        return layout

    @property
    def bootstrap(self) -> str:
        """Every node's address: clients find the cluster through any one that is up."""
        return ",".join(n.bootstrap for n in self.nodes)

    def node(self, i: int) -> EmbeddedBroker:
        return self.nodes[i - 1]

    def start(self) -> KafkaCluster:
        """Launch every node, wait until all answer, create the topics replicated."""
        try:
            for n in self.nodes:
                n.launch()
            with ThreadPoolExecutor(len(self.nodes)) as pool:
                list(pool.map(lambda n: n.wait_ready(), self.nodes))
            sec = self.security
            admin_conf = sec.client_config(sec.admin) if sec is not None else None
            if sec is not None:
                sec.ensure_users(self.bootstrap)
            if self.topics:
                create_topics(self.bootstrap, topic_specs(self.topics, self.partitions, self.replication),
                              extra=admin_conf)
            if sec is not None:
                sec.apply_acls(self.bootstrap)
        except BaseException:
            self.stop()
            raise
        return self

    def running(self) -> list[int]:
        """Node ids whose JVM is alive."""
        return [n.node_id for n in self.nodes if n.is_running()]

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
