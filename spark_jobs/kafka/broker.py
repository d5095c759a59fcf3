"""The embedded broker: Apache Kafka in KRaft mode, one JVM that is broker and controller.

The jars come from Maven Central through the pinned descriptor in `spark_jobs/jvm/`
(`spark_jobs.jvm.broker_classpath()`). The broker's log lives in a data folder of the
caller's (the work folder for `rulectl up`), so topics, `rules.active` included, survive
a restart of the broker; the folder is formatted once (`kafka.tools.StorageTool format
--standalone`) and reused after that.
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType

from confluent_kafka.admin import AdminClient

from spark_jobs.kafka.admin import TopicSpec, create_topics
from spark_jobs.kafka.security import BrokerSecurity

DEFAULT_TOPICS: tuple[str, ...] = (
    "events.raw",
    "context.raw",
    "rules.active",
    "events.processed",
    "events.shadow",
    "events.deadletter",
    "detect.status",
)

# Everything the platform creates at start. Under ACLs (the default of `rulectl up` and
# `rulectl broker`) no client but the admin may create topics, so the job's internal and
# control topics are created with the others, by the broker's admin.
PLATFORM_TOPICS: tuple[str, ...] = (*DEFAULT_TOPICS, "detect.control", "detect.restarts", "detect.warmup")

# Control topics hold one logical stream whose order matters across keys (the rule set,
# the job's status), so they always get one partition whatever `partitions` says.
SINGLE_PARTITION_TOPICS = frozenset({"rules.active", "detect.status", "detect.control", "detect.restarts"})

_DAY_MS = 24 * 3600 * 1000
# rules.active and the status topic are tables (newest record per key): compacted, kept
# forever. Data topics keep a week, dead letters a month (they are what an operator
# reads after the fact), the job's warm-up topic (read once, seconds after it is written) a day.
TOPIC_CONFIGS: dict[str, dict[str, str]] = {
    "rules.active": {"cleanup.policy": "compact", "min.compaction.lag.ms": "0"},
    # Written twice a second: small segments so compaction keeps it short.
    "detect.status": {"cleanup.policy": "compact", "segment.ms": str(3600 * 1000)},
    "detect.control": {"cleanup.policy": "compact"},
    # What the runner did to the job (restarts, crashes, giving up): an audit trail.
    "detect.restarts": {"retention.ms": str(30 * _DAY_MS)},
    "events.raw": {"retention.ms": str(7 * _DAY_MS)},
    "context.raw": {"retention.ms": str(7 * _DAY_MS)},
    "events.processed": {"retention.ms": str(7 * _DAY_MS)},
    "events.shadow": {"retention.ms": str(7 * _DAY_MS)},
    "events.deadletter": {"retention.ms": str(30 * _DAY_MS)},
    "detect.warmup": {"retention.ms": str(_DAY_MS)},
}

JAVA_ENV = "RULES_JAVA"
HEAP_ENV = "RULES_KAFKA_HEAP"

# librdkafka logs "connection refused" while the broker boots; that is expected noise.
_BOOT_LOGGER = logging.getLogger("spark_jobs.kafka.broker.boot")
_BOOT_LOGGER.addHandler(logging.NullHandler())
_BOOT_LOGGER.propagate = False

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
logger.server.name = kafka.server.KafkaRaftServer
logger.server.level = info
logger.broker.name = kafka.server.BrokerServer
logger.broker.level = info
"""


class BrokerError(RuntimeError):
    """The embedded broker could not be found, started or reached."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on `host` (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def topic_specs(
    topics: Iterable[str], partitions: int | Mapping[str, int] = 1, replication: int = 1
) -> dict[str, TopicSpec]:
    """TopicSpecs for `topics`: partitions per topic (int for all, or a mapping), configs.

    With replication above 1 every topic also gets `min.insync.replicas` = replication - 1
    (2 of 3), so an `acks=all` write survives one broker down and is refused, not lost,
    when two are.
    """
    specs: dict[str, TopicSpec] = {}
    for name in topics:
        if isinstance(partitions, Mapping):
            n = int(partitions.get(name, 1))
        else:
            n = 1 if name in SINGLE_PARTITION_TOPICS else int(partitions)
        config = dict(TOPIC_CONFIGS.get(name, {}))
        if replication > 1:
            config["min.insync.replicas"] = str(replication - 1)
        specs[name] = TopicSpec(partitions=max(1, n), config=config, replication=replication)
    return specs


def java_binary() -> str:
    java = os.environ.get(JAVA_ENV) or (
        str(Path(os.environ["JAVA_HOME"]) / "bin" / "java") if os.environ.get("JAVA_HOME") else shutil.which("java")
    )
    if not java:
        raise BrokerError("java not found: install a JDK 17 (Debian: openjdk-17-jre-headless) or set JAVA_HOME")
    return java


def new_cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (Kafka's Uuid)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class EmbeddedBroker:
    """Apache Kafka (KRaft, combined broker + controller) on host:port, topics created.

    Use as a context manager (`with EmbeddedBroker(port=free_port()) as b: b.bootstrap`)
    or call start()/stop(). `data_dir` keeps the log across restarts; without one a
    temporary folder is used and removed after a clean stop. The JVM runs in its own
    process group so that a Ctrl-C in the terminal reaches the owner first, which then
    stops the broker in order (SIGTERM: Kafka's controlled shutdown).
    """

    def __init__(
        self,
        port: int = 9092,
        host: str = "127.0.0.1",
        topics: Iterable[str] | None = DEFAULT_TOPICS,
        partitions: int | Mapping[str, int] = 1,
        startup_timeout: float = 60.0,
        log_path: str | Path | None = None,
        data_dir: str | Path | None = None,
        controller_port: int | None = None,
        extra_config: Mapping[str, str] | None = None,
        security: BrokerSecurity | None = None,
        node_id: int = 1,
        quorum_voters: str | None = None,
        cluster_id: str | None = None,
        replication: int = 1,
    ) -> None:
        self.host = host
        self.port = int(port)
        self.topics = tuple(topics or ())
        self.partitions = partitions
        self.startup_timeout = startup_timeout
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="kafka-"))
        self._log_path = Path(log_path) if log_path else self.data_dir / "broker.log"
        self.controller_port = controller_port
        self.extra_config = dict(extra_config or {})
        # SASL/SCRAM users and ACLs (spark_jobs/kafka/security.py); None: plaintext, open.
        self.security = security
        # Cluster member (KafkaCluster): its node id, the static controller quorum
        # (`1@host:port,2@...`) and the cluster id all members are formatted with.
        self.node_id = int(node_id)
        self.quorum_voters = quorum_voters
        self.cluster_id = cluster_id
        self.replication = int(replication)
        self._log_file: object | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        """The `bootstrap.servers` string clients use."""
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def log_path(self) -> Path | None:
        return self._log_path

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # ------------------------------------------------------------------ config

    def _controller_port(self) -> int:
        """The controller listener's port: kept in the data folder, because the KRaft
        quorum recorded at format time names it."""
        saved = self.data_dir / "controller.port"
        if saved.is_file():
            return int(saved.read_text().strip())
        port = self.controller_port or free_port(self.host)
        saved.write_text(str(port))
        return port

    def server_properties(self) -> dict[str, str]:
        cport = self._controller_port()
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.bootstrap.servers": f"{self.host}:{cport}",
            "listeners": f"PLAINTEXT://{self.host}:{self.port},CONTROLLER://{self.host}:{cport}",
            "advertised.listeners": f"PLAINTEXT://{self.host}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir / "log"),
            "num.partitions": "1",
            # One node: the internal topics cannot have more replicas than that.
            "offsets.topic.replication.factor": "1",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # Topics are created by the platform with their configs; a typo'd topic name
            # in a client must not create a topic with defaults.
            "auto.create.topics.enable": "false",
            "log.cleaner.backoff.ms": "1000",
        }
        if self.security is not None:
            props.update(self.security.server_properties(self.host, self.port, cport))
        if self.quorum_voters:
            props.update(self._cluster_properties())
        props.update(self.extra_config)
        return props

    def _cluster_properties(self) -> dict[str, str]:
        """A member of a static KRaft quorum: its id, the voters, and replicated internal
        topics; client-created topics default to `replication` replicas and at least
        replication - 1 in sync for an `acks=all` write."""
        r = str(self.replication)
        min_isr = str(max(1, self.replication - 1))
        props = {
            "node.id": str(self.node_id),
            "controller.quorum.voters": str(self.quorum_voters),
            "default.replication.factor": r,
            "min.insync.replicas": min_isr,
            "offsets.topic.replication.factor": r,
            "transaction.state.log.replication.factor": r,
            "transaction.state.log.min.isr": min_isr,
            "share.coordinator.state.topic.replication.factor": r,
            "share.coordinator.state.topic.min.isr": min_isr,
            # A broker that comes back after a crash becomes leader again of what it led.
            "auto.leader.rebalance.enable": "true",
            "leader.imbalance.check.interval.seconds": "10",
        }
        return props

    def _write_config(self, extra: Mapping[str, str] | None = None) -> Path:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path = self.data_dir / "server.properties"
        props = {**self.server_properties(), **dict(extra or {})}
        # The file may hold the admin's JAAS line: owner only, like the credentials file.
        from spark_jobs.platform.identity import write_secret_text

        write_secret_text(path, "".join(f"{k}={v}\n" for k, v in props.items()))
        (self.data_dir / "log4j2.properties").write_text(_LOG4J2)
        return path

    def _java(self, main: str, *args: str, heap: str = "256m") -> list[str]:
        from spark_jobs.jvm import broker_classpath
        from spark_jobs.jvm.class_archive import jvm_flags

        return [
            java_binary(), f"-Xmx{os.environ.get(HEAP_ENV, heap)}", "-Xms64m", "-XX:+UseG1GC",
            "-Djava.awt.headless=true", *jvm_flags("broker"),
            f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
            "-cp", broker_classpath(), main, *args,
        ]

    def _format(self, config: Path) -> None:
        """Format the log folder once; an already formatted one is kept (its data too)."""
        if (self.data_dir / "log" / "meta.properties").is_file():
            return
        scram = self.security.format_args() if self.security is not None else []
        if self.security is not None:
            self._scram_marker.write_text("SCRAM users stored at format time\n")
        # A static quorum (controller.quorum.voters) is formatted without --standalone,
        # every member with the same cluster id.
        quorum = [] if self.quorum_voters else ["--standalone"]
        # `--cluster-id=ID` in one argument: an id may start with "-" (URL-safe base64),
        # which the tool's parser takes for an option when it stands alone.
        cmd = self._java("kafka.tools.StorageTool", "format", *quorum,
                         f"--cluster-id={self.cluster_id or new_cluster_id()}", "-c", str(config), *scram,
                         heap="128m")
        done = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
        if done.returncode != 0:
            raise BrokerError(f"formatting {self.data_dir / 'log'} failed: {(done.stdout + done.stderr)[-2000:]}")

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> EmbeddedBroker:
        """Start the broker, wait until it answers Kafka requests, create the topics."""
        if self.is_running():
            return self
        self.launch()
        try:
            self._wait_ready()
            admin_conf = self.security.client_config(self.security.admin) if self.security is not None else None
            if self.security is not None:
                self.security.ensure_users(self.bootstrap)
            if self.topics:
                create_topics(self.bootstrap, topic_specs(self.topics, self.partitions, self.replication),
                              extra=admin_conf)
            if self.security is not None:
                self.security.apply_acls(self.bootstrap)
        except BaseException:
            self.stop()
            raise
        return self

    def launch(self) -> EmbeddedBroker:
        """Format (once) and spawn the JVM without waiting: a member of a quorum cannot
        answer before a majority of its peers run, so a cluster launches all, then waits."""
        if self.is_running():
            return self
        if port_in_use(self.host, self.port):
            raise BrokerError(f"{self.bootstrap} is already in use (another broker running?)")
        config = self._write_config()
        self._format(config)
        if self.security is not None and not self._scram_marker.exists():
            raise BrokerError(f"{self.data_dir} was formatted without SASL users: use a new --data-dir "
                              "(or --insecure, development only)")
        self._proc = self._spawn(config)
        return self

    @property
    def _scram_marker(self) -> Path:
        return self.data_dir / "scram.users"

    def wait_ready(self) -> None:
        """Block until this broker answers metadata requests (BrokerError if it died)."""
        self._wait_ready()

    def _spawn(self, config: Path) -> subprocess.Popen[bytes]:
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self._log_path, "ab")  # noqa: SIM115 - closed in stop()
        return subprocess.Popen(
            self._java("kafka.Kafka", str(config), heap="512m"),
            stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
        )

    def _wait_ready(self) -> None:
        """Poll metadata until the broker answers; fail fast if the process died."""
        conf = self.security.client_config(self.security.admin) if self.security is not None else {}
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "logger": _BOOT_LOGGER, **conf})
        deadline = time.monotonic() + self.startup_timeout
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise BrokerError(f"kafka exited with code {self._proc.returncode}: {self._log_tail()}")
            try:
                md = admin.list_topics(timeout=1.0)
                if md.brokers:
                    return
            except Exception as exc:  # KafkaException while the listener is not up yet
                if time.monotonic() > deadline:
                    raise BrokerError(f"broker at {self.bootstrap} not ready in {self.startup_timeout}s: {exc}") from exc
            if time.monotonic() > deadline:
                raise BrokerError(f"broker at {self.bootstrap} not ready in {self.startup_timeout}s")
            time.sleep(0.1)

    def _log_tail(self, n: int = 2000) -> str:
        try:
            return self._log_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the broker: SIGTERM (controlled shutdown, logs flushed), then SIGKILL."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout)
        if self._log_file is not None:
            self._log_file.close()  # type: ignore[attr-defined]
            self._log_file = None
        if self._own_dir and proc is not None and proc.returncode in (0, 143, -15):
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self.is_running() else "stopped"
        return f"EmbeddedBroker({self.bootstrap}, {state})"
