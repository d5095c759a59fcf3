"""A Spark standalone cluster on one machine: a master and N workers from the pyspark package.

The pip package ships `bin/spark-class`, so no Spark download is needed: this runs
`spark-class org.apache.spark.deploy.master.Master` and
`spark-class org.apache.spark.deploy.worker.Worker spark://HOST:PORT`, each in its own
process group with its log under the work folder. It is what `rulectl cluster` runs for
trying the scale-out on a laptop, and what the cluster tests kill workers of; on real
hosts the same two commands (`master_command`, `worker_command`) run one per host, which
is what docker/docker-compose.yml does.

Python applications run on standalone in client mode only: the driver (`rulectl detect
--master spark://...`, a backtest) runs where it is started and the executors on the
workers. Executors need the project's interpreter and package on every worker host
(`PYSPARK_PYTHON`; in docker the same image).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
# The master and worker daemons only schedule; the executors they launch get their own
# memory (spark.executor.memory). Spark's default of 1g each is a lot on a small machine.
DAEMON_MEMORY = "256m"


class SparkClusterError(RuntimeError):
    """The local standalone cluster could not be started or did not come up."""


def spark_class() -> str:
    """`spark-class` of the installed pyspark (next to the interpreter, or in pyspark/bin)."""
    beside = Path(sys.executable).parent / "spark-class"
    if beside.is_file():
        return str(beside)
    import pyspark

    packaged = Path(pyspark.__file__).parent / "bin" / "spark-class"
    if packaged.is_file():
        return str(packaged)
    found = shutil.which("spark-class")
    if not found:
        raise SparkClusterError("spark-class not found: install pyspark (pip) into this interpreter")
    return found


def master_command(host: str, port: int, webui_port: int) -> list[str]:
    """The master's command line (one per cluster)."""
    return ["spark-class", MASTER_CLASS, "--host", host, "--port", str(port), "--webui-port", str(webui_port)]


def worker_command(master_url: str, host: str, cores: int, memory: str, webui_port: int, work_dir: str) -> list[str]:
    """A worker's command line: it offers `cores` and `memory` to the master's applications."""
    return ["spark-class", WORKER_CLASS, "--host", host, "--cores", str(cores), "--memory", memory,
            "--webui-port", str(webui_port), "--work-dir", work_dir, master_url]


@dataclass
class _Proc:
    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self.popen.pid if self.popen else None

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None


class LocalSparkCluster:
    """A standalone master on host:port (web UI on webui_port) and `workers` workers.

    Workers get `worker_cores` cores and `worker_memory` each (defaults: 1 core, 1g: one
    1g executor per worker, the test clusters of a 2-core machine). Use as a context
    manager or start()/stop(); `kill_worker(i)` is a SIGKILL of worker i's JVM (a lost
    host), its executors die with it.
    """

    def __init__(
        self,
        work_dir: str | Path,
        workers: int = 2,
        host: str = "127.0.0.1",
        port: int = 7077,
        webui_port: int = 8080,
        worker_cores: int = 1,
        worker_memory: str = "1g",
        startup_timeout: float = 90.0,
    ) -> None:
        self.work_dir = Path(work_dir)
        self.host = host
        self.port = port
        self.webui_port = webui_port
        self.startup_timeout = startup_timeout
        self.master = _Proc("master", master_command(host, port, webui_port), self.work_dir / "master.log")
        self.workers = [
            _Proc(f"worker-{i + 1}",
                  worker_command(self.master_url, host, worker_cores, worker_memory, webui_port + 1 + i,
                                 str(self.work_dir / f"worker-{i + 1}")),
                  self.work_dir / f"worker-{i + 1}.log")
            for i in range(workers)
        ]

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://{self.host}:{self.webui_port}"

    def state(self, timeout: float = 5.0) -> dict:
        """The master's JSON view (`/json/`): workers, active and completed applications."""
        with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=timeout) as resp:  # noqa: S310 - http on loopback
            return json.loads(resp.read())

    def alive_workers(self) -> int:
        try:
            return sum(1 for w in self.state().get("workers", []) if w.get("state") == "ALIVE")
        except OSError:
            return 0

    # ------------------------------------------------------------------ lifecycle

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("SPARK_DAEMON_MEMORY", DAEMON_MEMORY)
        # Executors run Python with the driver's interpreter path; on one machine that is
        # this one (in docker, the image's).
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        env.setdefault("SPARK_NO_DAEMONIZE", "1")
        # The master's and workers' JVMs map the class archive of Spark's jars too, which
        # needs their class path to begin as the archive's (the platform's jar first).
        from spark_jobs.jvm import operator_jar
        from spark_jobs.jvm.class_archive import jvm_flags

        env["SPARK_DAEMON_JAVA_OPTS"] = " ".join([*jvm_flags("spark"), env.get("SPARK_DAEMON_JAVA_OPTS", "")]).strip()
        if (head := operator_jar()) is not None:
            env["SPARK_DAEMON_CLASSPATH"] = os.pathsep.join(
                p for p in (str(head), env.get("SPARK_DAEMON_CLASSPATH", "")) if p)
        return env

    def _spawn(self, proc: _Proc) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        argv = [spark_class(), *proc.argv[1:]]
        with open(proc.log, "ab") as log:
            proc.popen = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env=self._env(), start_new_session=True)

    def start(self) -> LocalSparkCluster:
        """Start the master, then the workers; return when every worker is registered."""
        try:
            self._spawn(self.master)
            self._wait(lambda: self._master_up(), "the master's web UI")
            for w in self.workers:
                self._spawn(w)
            self._wait(lambda: self.alive_workers() >= len(self.workers), f"{len(self.workers)} workers registered")
        except BaseException:
            self.stop()
            raise
        return self

    def _master_up(self) -> bool:
        try:
            self.state(timeout=1.0)
            return True
        except OSError:
            return False

    def _wait(self, pred: object, what: str) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            for p in (self.master, *self.workers):
                if p.popen is not None and p.popen.poll() is not None:
                    raise SparkClusterError(f"{p.name} exited with {p.popen.returncode}: {_tail(p.log)}")
            if pred():  # type: ignore[operator]
                return
            time.sleep(0.3)
        raise SparkClusterError(f"timed out after {self.startup_timeout}s waiting for {what}")

    def start_worker(self, i: int) -> None:
        """(Re)start worker i (1-based), e.g. after kill_worker."""
        w = self.workers[i - 1]
        if not w.alive():
            self._spawn(w)

    def kill_worker(self, i: int) -> int:
        """SIGKILL worker i's JVM (1-based): a host lost without warning. Returns its pid."""
        w = self.workers[i - 1]
        if not w.alive() or w.popen is None:
            raise SparkClusterError(f"{w.name} is not running")
        w.popen.kill()
        w.popen.wait(30)
        return w.popen.pid

    def stop(self, timeout: float = 30.0) -> None:
        """Workers first (their executors with them), then the master; each group killed
        if SIGTERM did not end it."""
        for p in (*reversed(self.workers), self.master):
            _stop_group(p, timeout)

    def __enter__(self) -> LocalSparkCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _stop_group(p: _Proc, timeout: float) -> None:
    """SIGTERM the process group (a worker's executors are in it), SIGKILL what remains."""
    if p.popen is None:
        return
    pgid = p.popen.pid  # start_new_session: the child leads its own group
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.popen.wait(timeout)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        p.popen.wait(timeout)


def _tail(path: Path, n: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""
