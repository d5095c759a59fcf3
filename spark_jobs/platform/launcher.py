"""Start, watch and stop a set of processes as one unit (the engine of `rulectl up`).

The embedded platform is several long-running processes (broker, detection job, demo
generator, Airflow) that only make sense together: a dead broker makes the job useless,
and a Ctrl-C must not leave a JVM or an Airflow scheduler behind. This module keeps that
logic apart from what the processes are, so it can be tested with dummy commands:

* `ChildSpec` says how to run one process: argv, environment, log file, which signal
  stops it gracefully and how long that may take, whether it is restarted when it exits,
  and how to tell that it is ready.
* `Supervisor` starts components in order, polls them, restarts the ones whose policy
  says so (with backoff and a budget, so a crash loop ends), and stops everything in
  reverse start order: consumers before what they consume from.

Every child runs in its own session (process group). A Ctrl-C in the terminal therefore
reaches only the supervisor, which then stops the children one by one with each one's
own graceful signal (the detection job needs SIGTERM to commit its last micro-batch,
`airflow standalone` needs SIGINT to stop its own children). Whatever is still alive in
a child's group afterwards (a JVM, a uvicorn worker) is terminated with the group, and
so is any descendant that had left the group (an Airflow task runs in a session of its
own, and its Spark JVM under it).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, TextIO

import psutil


@dataclass(frozen=True)
class RestartPolicy:
    """Restart a child when it exits, at most `max_restarts` times per `window_s`.

    A clean exit (code 0) is restarted at once: it means someone asked the child to stop
    (e.g. the detection supervisor wants a restart to apply a new watermark). A crash
    waits `backoff_s`, doubled per consecutive crash up to `max_backoff_s`, so a child
    that cannot start does not spin.
    """

    max_restarts: int = 5
    window_s: float = 600.0
    backoff_s: float = 2.0
    max_backoff_s: float = 30.0


@dataclass
class ChildSpec:
    """How to run one child process. See the module docstring for why each knob exists."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str] | None = None  # the complete environment (None: inherit)
    cwd: str | Path | None = None
    log_path: str | Path | None = None  # None: output goes to the supervisor's stdout
    stop_signal: int = signal.SIGTERM
    stop_timeout: float = 30.0
    restart: RestartPolicy | None = None
    echo: bool = False  # also copy output lines to the console, prefixed with the name
    ready: Callable[[], bool] | None = None
    ready_message: str | None = None
    on_ready: Callable[[], None] | None = None  # run once per start, in a thread, when ready
    before_start: Callable[[], None] | None = None  # e.g. clear a stale readiness marker
    # Neighbours (in stop order) with the same group stop together: Airflow's components
    # do not need each other to shut down, and one at a time a Ctrl-C waited for each
    # one's timeout in turn.
    stop_group: str | None = None


class Component(Protocol):
    """Anything the supervisor can start, watch and stop (a child process, the broker)."""

    name: str

    def start(self) -> None: ...
    def poll(self) -> int | None: ...  # None while running, else the exit code
    def stop(self, force: threading.Event | None = None) -> int | None: ...
    def describe(self) -> dict: ...


class ChildProcess:
    """A running (or restartable) child described by a ChildSpec."""

    def __init__(self, spec: ChildSpec, out: TextIO | None = None) -> None:
        self.spec = spec
        self.name = spec.name
        self.out = out or sys.stdout
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None
        self.restarts = 0
        self._log: object | None = None
        self._echo_thread: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        """Spawn the process in a new session; output to its log (and console if echo)."""
        if self.spec.before_start is not None:
            self.spec.before_start()
        log_file = None
        if self.spec.log_path is not None:
            path = Path(self.spec.log_path)
            path.parent.mkdir(parents=True, exist_ok=True)
            log_file = open(path, "ab")  # noqa: SIM115 - closed when the child is stopped
            log_file.write(
                f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} starting {self.name}: {list(self.spec.argv)}\n".encode()
            )
            log_file.flush()
        self._log = log_file
        stdout: object = subprocess.PIPE if self.spec.echo else (log_file if log_file is not None else None)
        self.proc = subprocess.Popen(
            list(self.spec.argv),
            env=dict(self.spec.env) if self.spec.env is not None else None,
            cwd=str(self.spec.cwd) if self.spec.cwd is not None else None,
            stdin=subprocess.DEVNULL,
            stdout=stdout,  # type: ignore[arg-type]
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.started_at = time.monotonic()
        if self.spec.echo:
            self._echo_thread = threading.Thread(target=self._pump, name=f"echo-{self.name}", daemon=True)
            self._echo_thread.start()

    def _pump(self) -> None:
        """Copy the child's output to its log and, line by line, to the console."""
        assert self.proc is not None and self.proc.stdout is not None
        log = self._log
        for line in self.proc.stdout:
            if log is not None:
                with contextlib.suppress(ValueError, OSError):  # log closed during shutdown
                    log.write(line)  # type: ignore[attr-defined]
                    log.flush()  # type: ignore[attr-defined]
            text = line.decode("utf-8", errors="replace").rstrip()
            with contextlib.suppress(ValueError, OSError):
                print(f"[{self.name}] {text}", file=self.out, flush=True)

    def poll(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def stop(self, force: threading.Event | None = None) -> int | None:
        """Graceful signal, wait up to stop_timeout, then SIGTERM/SIGKILL the whole group."""
        proc = self.proc
        if proc is None:
            return None
        strays = _descendants(proc.pid)
        if proc.poll() is None:
            _signal_pid(proc.pid, self.spec.stop_signal)
            if not _wait(proc, self.spec.stop_timeout, force):
                print(
                    f"{self.name}: still running after {self.spec.stop_timeout:g}s, terminating",
                    file=self.out,
                    flush=True,
                )
                _signal_group(proc.pid, signal.SIGTERM)
                if not _wait(proc, 5.0, force):
                    _signal_group(proc.pid, signal.SIGKILL)
                    proc.wait()
        _reap_group(proc.pid, force)
        _reap_strays(strays, force)
        self._close()
        return proc.returncode

    def _close(self) -> None:
        if self._echo_thread is not None:
            self._echo_thread.join(timeout=2.0)
            self._echo_thread = None
        if self._log is not None:
            with contextlib.suppress(OSError):
                self._log.close()  # type: ignore[attr-defined]
            self._log = None

    def log_tail(self, n_chars: int = 2000) -> str:
        if self.spec.log_path is None:
            return ""
        try:
            return Path(self.spec.log_path).read_text(errors="replace")[-n_chars:]
        except OSError:
            return ""

    def describe(self) -> dict:
        return {
            "pid": self.pid,
            "argv": list(self.spec.argv),
            "log": str(self.spec.log_path) if self.spec.log_path else None,
            "restarts": self.restarts,
            "running": self.poll() is None and self.proc is not None,
        }


def _signal_pid(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _signal_group(pgid: int, sig: int) -> bool:
    """Signal a whole process group; False when no process of it is left."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # only zombies left (macOS reports those so)
        return False


def _wait(proc: subprocess.Popen[bytes], timeout: float, force: threading.Event | None) -> bool:
    """Wait for `proc` up to `timeout`; returns early (False) when `force` is set."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return True
        if force is not None and force.is_set():
            return False
        time.sleep(0.05)
    return proc.poll() is not None


def _reap_group(pgid: int, force: threading.Event | None, grace: float = 5.0) -> None:
    """Terminate what is left of a child's process group after the child itself exited.

    The group is ours (the child was started in a new session with pgid = its pid), so
    this only reaches processes the child started: a JVM, a scheduler's workers.
    """
    if not _signal_group(pgid, 0):
        return
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and not (force is not None and force.is_set()):
        if not _signal_group(pgid, 0):
            return
        time.sleep(0.1)
    _signal_group(pgid, signal.SIGKILL)


def _descendants(pid: int) -> list[psutil.Process]:
    """Every process `pid` started, at any depth, whatever its group."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _reap_strays(procs: list[psutil.Process], force: threading.Event | None, grace: float = 5.0) -> None:
    """Terminate the child's descendants that left its process group and outlived it.

    An Airflow task runs in a session of its own (`airflow worker -- <id>`, and under it
    the task's Spark JVM): stopping `airflow standalone` and its group left a running
    `archive_maintenance` task and its JVM behind. psutil knows a
    process by pid and start time, so a pid reused since the snapshot is left alone.
    """
    alive = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.is_running():
                p.terminate()
                alive.append(p)
    if not alive:
        return
    wait = 0.1 if force is not None and force.is_set() else grace
    _, left = psutil.wait_procs(alive, timeout=wait)
    for p in left:
        with contextlib.suppress(psutil.Error):
            p.kill()


@dataclass
class _Watch:
    component: Component
    spec: ChildSpec | None
    restart_times: deque[float] = field(default_factory=deque)
    consecutive_crashes: int = 0
    restart_at: float | None = None
    ready_reported: bool = False
    next_ready_check: float = 0.0


class Supervisor:
    """Starts components in order, watches them, stops them in reverse order.

    `history` records what happened ("start NAME", "restart NAME", "exit NAME CODE",
    "stop NAME") so tests, and the platform state file, can tell.
    """

    def __init__(
        self,
        out: TextIO | None = None,
        poll_interval: float = 0.5,
        on_change: Callable[[Supervisor], None] | None = None,
    ) -> None:
        self.out = out or sys.stdout
        self.poll_interval = poll_interval
        self.on_change = on_change
        self.history: list[str] = []
        self.failure: str | None = None
        self.force = threading.Event()  # set by a second Ctrl-C: stop without waiting
        self._watches: list[_Watch] = []
        self._lock = threading.Lock()
        self._say_lock = threading.Lock()
        self._stopped = False

    @property
    def components(self) -> list[Component]:
        return [w.component for w in self._watches]

    def say(self, text: str) -> None:
        with self._say_lock:  # one whole line per message, also from parallel stops
            self.out.write(text + "\n")
            self.out.flush()

    def start(self, component: Component, spec: ChildSpec | None = None) -> Component:
        """Start one component now (it is stopped with the others, in reverse order)."""
        if spec is None and isinstance(component, ChildProcess):
            spec = component.spec
        component.start()
        self._watches.append(_Watch(component, spec))
        self.history.append(f"start {component.name}")
        self._changed()
        return component

    def start_child(self, spec: ChildSpec) -> ChildProcess:
        child = ChildProcess(spec, self.out)
        self.start(child, spec)
        return child

    def run(self, stop: threading.Event) -> int:
        """Watch until `stop` is set (0) or a component fails for good (1)."""
        while not stop.wait(self.poll_interval):
            if self.check() is not None:
                return 1
        return 0

    def check(self) -> str | None:
        """One supervision round; returns the failure message when the platform must stop."""
        now = time.monotonic()
        for watch in self._watches:
            comp = watch.component
            if watch.restart_at is not None:
                if now >= watch.restart_at:
                    watch.restart_at = None
                    self._restart(watch)
                continue
            code = comp.poll()
            if code is None:
                self._check_ready(watch, now)
                continue
            self.history.append(f"exit {comp.name} {code}")
            policy = watch.spec.restart if watch.spec is not None else None
            if policy is not None and self._may_restart(watch, policy, now):
                if code == 0:
                    watch.consecutive_crashes = 0
                    delay = 0.0
                else:
                    delay = min(policy.max_backoff_s, policy.backoff_s * 2**watch.consecutive_crashes)
                    watch.consecutive_crashes += 1
                self.say(f"{comp.name} exited with code {code}; restarting in {delay:g}s{_log_hint(comp)}")
                self._print_tail(comp, code)
                if isinstance(comp, ChildProcess):
                    comp.stop(self.force)  # reap what is left of its group, close the log
                watch.restart_at = now + delay
                continue
            reason = f"{comp.name} exited with code {code}"
            if policy is not None:
                reason += f" ({policy.max_restarts} restarts in {policy.window_s:g}s used up)"
            self.failure = reason
            self.say(f"ERROR: {reason}; stopping the platform{_log_hint(comp)}")
            self._print_tail(comp, code)
            return reason
        return None

    def _may_restart(self, watch: _Watch, policy: RestartPolicy, now: float) -> bool:
        while watch.restart_times and now - watch.restart_times[0] > policy.window_s:
            watch.restart_times.popleft()
        return len(watch.restart_times) < policy.max_restarts

    def _restart(self, watch: _Watch) -> None:
        comp = watch.component
        watch.restart_times.append(time.monotonic())
        watch.ready_reported = False
        if isinstance(comp, ChildProcess):
            comp.restarts += 1
        comp.start()
        self.history.append(f"restart {comp.name}")
        pid = getattr(comp, "pid", None)
        self.say(f"{comp.name} restarted" + (f" (pid {pid})" if pid else ""))
        self._changed()

    def _check_ready(self, watch: _Watch, now: float) -> None:
        spec = watch.spec
        if watch.ready_reported or spec is None or spec.ready is None or now < watch.next_ready_check:
            return
        watch.next_ready_check = now + 2.0
        try:
            ok = spec.ready()
        except Exception:  # noqa: BLE001 - a probe that fails means "not ready yet"
            ok = False
        if ok:
            watch.ready_reported = True
            self.history.append(f"ready {watch.component.name}")
            self.say(spec.ready_message or f"{watch.component.name} is ready")
            if spec.on_ready is not None:
                threading.Thread(
                    target=self._run_hook, args=(watch.component.name, spec.on_ready), daemon=True
                ).start()

    def _run_hook(self, name: str, hook: Callable[[], None]) -> None:
        try:
            hook()
        except Exception as exc:  # noqa: BLE001 - a hook failing must not stop the platform
            self.say(f"{name}: post-start step failed: {exc}")

    def _print_tail(self, comp: Component, code: int) -> None:
        if code == 0 or not isinstance(comp, ChildProcess):
            return
        tail = comp.log_tail(1500).strip()
        if tail:
            self.say(f"---- last lines of {comp.name}'s log ----\n{tail}\n----")

    def stop_all(self) -> None:
        """Stop every component, last started first. Safe to call twice."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        def group(w: _Watch) -> object:
            return (w.spec.stop_group if w.spec is not None else None) or id(w)

        for _, neighbours in itertools.groupby(reversed(self._watches), key=group):
            batch = list(neighbours)
            threads = [threading.Thread(target=self._stop_one, args=(w.component,)) for w in batch[1:]]
            for t in threads:
                t.start()
            self._stop_one(batch[0].component)
            for t in threads:
                t.join()
        self._changed()

    def _stop_one(self, comp: Component) -> None:
        running = comp.poll() is None
        if running:
            self.say(f"stopping {comp.name} ...")
        try:
            code = comp.stop(self.force)
        except Exception as exc:  # noqa: BLE001 - one failing stop must not skip the rest
            self.say(f"error stopping {comp.name}: {exc}")
            code = None
        with self._lock:
            self.history.append(f"stop {comp.name}")
        if running:
            self.say(f"stopped {comp.name}" + (f" (exit code {code})" if code is not None else ""))

    def describe(self) -> dict[str, dict]:
        return {w.component.name: w.component.describe() for w in self._watches}

    def _changed(self) -> None:
        if self.on_change is not None:
            with contextlib.suppress(Exception):
                self.on_change(self)


def _log_hint(comp: Component) -> str:
    if isinstance(comp, ChildProcess) and comp.spec.log_path:
        return f" (log: {comp.spec.log_path})"
    return ""


class BrokerComponent:
    """The embedded broker (spark_jobs.kafka.broker.EmbeddedBroker) as a Component.

    It stops with SIGTERM (Kafka's controlled shutdown), which EmbeddedBroker.stop() sends.
    """

    def __init__(self, broker: object, name: str = "broker") -> None:
        self.broker = broker
        self.name = name

    @property
    def pid(self) -> int | None:
        return self.broker.pid  # type: ignore[attr-defined]

    def start(self) -> None:
        self.broker.start()  # type: ignore[attr-defined]

    def poll(self) -> int | None:
        if self.broker.is_running():  # type: ignore[attr-defined]
            return None
        proc = getattr(self.broker, "_proc", None)
        code = proc.returncode if proc is not None else None
        return 1 if code is None else int(code)

    def stop(self, force: threading.Event | None = None) -> int | None:
        self.broker.stop(timeout=5.0 if force is not None and force.is_set() else 30.0)  # type: ignore[attr-defined]
        return None

    def describe(self) -> dict:
        return {
            "pid": self.pid,
            "bootstrap": self.broker.bootstrap,  # type: ignore[attr-defined]
            "log": str(self.broker.log_path) if self.broker.log_path else None,  # type: ignore[attr-defined]
            "running": self.broker.is_running(),  # type: ignore[attr-defined]
        }
