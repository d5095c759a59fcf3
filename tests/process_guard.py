"""What a test starts, held to its markers (a pytest plugin; tests/conftest.py registers it).

A test that starts a JVM (a Spark session, spark-submit, a Spark Connect server, the
embedded Kafka broker, Maven) or Airflow says so with a marker, so that
`pytest -m "not spark and not kafka and not airflow"` is a subset that starts none of
them. What needs which marker:

    Spark (spark-submit, a JVM running org.apache.spark.*)   spark
    the Kafka broker (a JVM running kafka.Kafka, kafka.tools.*)  kafka
    any other JVM (java, mvn)                                spark or kafka
    Airflow (the `airflow` CLI and its processes)            airflow

A start is seen two ways, both cheap:

- in the pytest process: every child process (subprocess.run, check_output, Popen: all
  end in Popen._execute_child) is checked before it exists, and so is pyspark's
  `SparkSession.builder.getOrCreate()` (which may hand back a session an earlier test
  started). An unmarked start raises ProcessGuardError on the spot;
- below the pytest process: while a test that lacks a marker runs, a thread lists the
  descendants of the pytest process every POLL_S seconds. A new java or airflow process
  whose ancestors up to pytest are all new (started by the test, e.g. `rulectl detect`
  in a subprocess whose Python runs spark-submit, and not by a JVM or api-server an
  earlier test left running) is a start.

Either way the test fails, naming the command line and the marker it lacks, even if the
code under test swallowed the error. A module that starts one when imported fails its
collection. Fixtures that start one mark the tests that use them (FIXTURE_MARKS).
Not seen: a process that leaves the tree (a double fork) and ends within POLL_S.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
from collections.abc import Sequence

import psutil
import pytest

POLL_S = 0.1
GUARDED = ("spark", "kafka", "airflow")
# kind of process -> the markers any one of which allows it
NEEDS = {"spark": ("spark",), "kafka": ("kafka",), "jvm": ("spark", "kafka"), "airflow": ("airflow",)}
WHAT = {"spark": "Spark (a JVM)", "kafka": "the Kafka broker (a JVM)", "jvm": "a JVM", "airflow": "Airflow"}
# Fixtures whose users start what the marker names (kafka_broker: tests/conftest.py's Kafka section).
FIXTURE_MARKS = {"spark": "spark", "velocity_pass": "spark", "airflow_env": "airflow"}

SPARK_SCRIPTS = {"spark-submit", "spark-class", "spark-shell", "pyspark", "spark-sql", "beeline",
                 "start-master.sh", "start-worker.sh", "start-connect-server.sh", "spark-daemon.sh"}
SHELLS = {"sh", "bash", "dash", "zsh", "env"}


class ProcessGuardError(RuntimeError):
    """A test started something its markers do not allow."""


def _base(word: str) -> str:
    return os.path.basename(word.split()[0]) if word.strip() else ""


def classify(argv: Sequence[str]) -> str | None:
    """The kind of process a command line starts (a key of NEEDS), or None."""
    argv = [os.fsdecode(a) for a in argv]
    if not argv:
        return None
    first = _base(argv[0])  # a process title set by setproctitle is one word list: "airflow scheduler -- ..."
    if first in SHELLS and "-c" in argv[1:3]:  # `sh -c "cd x && java ..."`: any word of the command
        script = argv[argv.index("-c", 1) + 1] if len(argv) > argv.index("-c", 1) + 1 else ""
        try:
            words = shlex.split(script)
        except ValueError:
            words = script.split()
        kinds = [classify(words[i:]) for i in range(len(words))]
        return next((k for k in kinds if k), None)
    # An interpreter running a script: `python /venv/bin/airflow`, `bash .../spark-submit`.
    interpreted = first.startswith("python") or first in SHELLS
    prog = {first, _base(argv[1])} if interpreted and len(argv) > 1 else {first}
    if first.startswith("python") and argv[1:3] == ["-m", "airflow"]:
        return "airflow"
    if "airflow" in prog:
        return "airflow"
    if prog & SPARK_SCRIPTS:
        return "spark"
    if first == "java":
        if any(a == "kafka.Kafka" or a.startswith(("kafka.tools.", "kafka.admin.")) for a in argv):
            return "kafka"
        if any(a.startswith("org.apache.spark.") for a in argv):
            return "spark"
        return "jvm"
    if first in ("mvn", "mvnw"):
        return "jvm"
    return None


def _show(argv: Sequence[str], limit: int = 300) -> str:
    text = " ".join(os.fsdecode(a) for a in argv)
    return text if len(text) <= limit else text[:limit] + " ..."


class Watch:
    """One test (or the collection): what it is allowed to start, and what it started."""

    def __init__(self, name: str, marks: set[str]) -> None:
        self.name = name
        self.marks = marks
        self.found: list[str] = []
        self.reported = False
        self.root = os.getpid()
        self._lock = threading.Lock()
        self._done: set[tuple[int, float]] = set()
        self._baseline = {key for key, _, _ in self._tree().values()}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def lacking(self, kind: str) -> tuple[str, ...] | None:
        needs = NEEDS[kind]
        return None if self.marks & set(needs) else needs

    def note(self, kind: str, what: str, how: str) -> str | None:
        """Records a start the markers do not allow; its message, or None if allowed."""
        needs = self.lacking(kind)
        if needs is None:
            return None
        markers = " or ".join(f"@pytest.mark.{m}" for m in needs)
        msg = (f"{self.name} started {WHAT[kind]} ({how}: {what}) without {markers}: mark the test or its "
               f"module (pytestmark), or keep it from starting one")
        with self._lock:
            if msg not in self.found:
                self.found.append(msg)
        return msg

    def report(self) -> str:
        self.reported = True
        return "process guard (tests/process_guard.py):\n  " + "\n  ".join(self.found)

    # -- below the pytest process
    def _tree(self) -> dict[int, tuple[tuple[int, float], int, psutil.Process]]:
        out = {}
        try:
            kids = psutil.Process(self.root).children(recursive=True)
        except psutil.Error:
            return out
        for p in kids:
            try:
                out[p.pid] = ((p.pid, p.create_time()), p.ppid(), p)
            except psutil.Error:
                continue
        return out

    def poll(self) -> None:
        tree = self._tree()
        for _pid, (key, ppid, proc) in tree.items():
            if key in self._baseline or key in self._done:
                continue
            anc, ours = ppid, True  # started by the test: every ancestor up to pytest is new
            while anc != self.root:
                entry = tree.get(anc)
                if entry is None or entry[0] in self._baseline:
                    ours = False
                    break
                anc = entry[1]
            if not ours:
                self._done.add(key)
                continue
            try:
                argv = proc.cmdline()
            except psutil.Error:
                continue
            kind = classify(argv)
            if kind is not None:  # else looked at again: a forked child may exec java later
                self._done.add(key)
                self.note(kind, _show(argv), f"process {proc.pid}")

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self.poll()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="process-guard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self.poll()


_current: Watch | None = None
_original_execute_child = subprocess.Popen._execute_child


def _guarded_execute_child(self, args, executable, *rest):
    watch = _current
    if watch is not None:
        argv = [args] if isinstance(args, str | bytes | os.PathLike) else list(args)
        shell = rest[7]
        if shell:
            argv = ["/bin/sh", "-c", " ".join(os.fsdecode(a) for a in argv)]
        elif executable is not None:
            argv = [executable, *argv[1:]]
        kind = classify(argv)
        msg = watch.note(kind, _show(argv), "subprocess") if kind else None
        if msg:
            raise ProcessGuardError(msg)
    return _original_execute_child(self, args, executable, *rest)


def _spark_builders() -> list[type]:
    """pyspark's session builders, once pyspark is imported (a session can exist only then)."""
    out = []
    for module in ("pyspark.sql.session", "pyspark.sql.connect.session"):
        mod = sys.modules.get(module)
        builder = getattr(getattr(mod, "SparkSession", None), "Builder", None)
        if builder is not None and "getOrCreate" in vars(builder):
            out.append(builder)
    return out


_patched: list[tuple[type, object]] = []


def _refuse_spark(watch: Watch) -> None:
    def get_or_create(builder, *args, **kwargs):
        raise ProcessGuardError(watch.note("spark", "SparkSession.builder.getOrCreate()", "pyspark"))

    for builder in _spark_builders():
        _patched.append((builder, vars(builder)["getOrCreate"]))
        builder.getOrCreate = get_or_create


def _restore_spark() -> None:
    while _patched:
        builder, original = _patched.pop()
        builder.getOrCreate = original


def _begin(name: str, marks: set[str], poll: bool) -> Watch:
    global _current
    watch = Watch(name, marks)
    if watch.lacking("spark"):
        _refuse_spark(watch)
    if poll and any(watch.lacking(k) for k in NEEDS):
        watch.start()
    _current = watch
    return watch


def _end() -> Watch | None:
    global _current
    watch, _current = _current, None
    _restore_spark()
    if watch is not None:
        watch.stop()
    return watch


# ----------------------------------------------------------------------------- hooks


def pytest_configure(config: pytest.Config) -> None:
    subprocess.Popen._execute_child = _guarded_execute_child


def pytest_unconfigure(config: pytest.Config) -> None:
    subprocess.Popen._execute_child = _original_execute_child


def pytest_itemcollected(item: pytest.Item) -> None:
    names = set(getattr(item, "fixturenames", ()))
    for fixture, mark in FIXTURE_MARKS.items():
        if fixture in names and item.get_closest_marker(mark) is None:
            item.add_marker(getattr(pytest.mark, mark))


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session):
    _begin("the collection (a module that starts it when imported)", set(), poll=False)
    try:
        return (yield)
    finally:
        _end()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_setup(item: pytest.Item):
    _end()
    _begin(item.nodeid, {m.name for m in item.iter_markers() if m.name in GUARDED}, poll=True)
    return (yield from _phase(final=False))


def _fail_if_found(watch: Watch | None) -> None:
    if watch is not None and watch.found and not watch.reported:
        raise pytest.fail.Exception(watch.report(), pytrace=False) from None


def _phase(final: bool):
    """Runs a phase (setup, call): a ProcessGuardError it raises is the report; a start
    seen otherwise fails it (in place of whatever else it raised) unless `final` is
    False and the phase passed (the call reports it then)."""
    watch = _current
    try:
        result = yield
    except ProcessGuardError:
        if watch is not None:
            watch.reported = True
        raise
    except BaseException:
        if watch is not None:
            watch.poll()
        _fail_if_found(watch)
        raise
    if final and watch is not None:
        watch.poll()
        _fail_if_found(watch)
    return result


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_call(item: pytest.Item):
    return (yield from _phase(final=True))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    try:
        return (yield)
    finally:
        _fail_if_found(_end())
