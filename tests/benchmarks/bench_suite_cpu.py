"""Where a test run's CPU goes: runs a command (by default `make test`, the README's test
command) and samples every process on the machine every 2 s, then sums each process's
CPU time (user + system, from its own start or from the first sample) by what it is:
the Spark JVMs by who started them (the detection job, the archive job, a Connect
server, an Airflow task, a test's own session), the Kafka brokers, Airflow's
components by role (scheduler, DAG processor, API server, triggerer, the executor's
workers, the tasks, a test's `airflow dags test`), pytest's workers, the rest.

    .venv/bin/python tests/benchmarks/bench_suite_cpu.py              # make test
    .venv/bin/python tests/benchmarks/bench_suite_cpu.py -- make test ARGS='-k conformance'

A process that lives less than one sample is not seen; the CPU of processes that were
running before the command started is counted from the first sample only. The suite is
CPU-bound on two cores (busy = CPU seconds / (wall seconds x cores)), so CPU seconds,
not waits, are what a shorter run must remove.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import ROOT, append_result  # noqa: E402

SAMPLE_S = 2.0
# Environment variables a row names when set: the class archive off (RULES_CDS=off) and
# the JVMs' own options.
ENV_NOTED = ("RULES_CDS", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS")


@dataclass
class Seen:
    ppid: int
    cmdline: str
    base_cpu: float  # CPU already spent when first seen (non-zero only for processes older than the run)
    cpu: float = 0.0


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def sample(seen: dict[tuple[int, float], Seen], first: bool) -> None:
    for p in psutil.process_iter(["pid", "ppid", "create_time"]):
        try:
            key = (p.info["pid"], p.info["create_time"])
            cpu = _cpu(p)
            cmd = " ".join(p.cmdline())  # read again each time: spark-submit's shell execs into java
        except (psutil.Error, OSError):
            continue
        s = seen.get(key)
        if s is None:
            s = seen[key] = Seen(p.info["ppid"], cmd, cpu if first else 0.0)
        s.cmdline = cmd or s.cmdline
        s.cpu = max(s.cpu, cpu)


def _owner(seen_by_pid: dict[int, Seen], ppid: int) -> str:
    """What started a Spark JVM: the nearest ancestor that says what it is."""
    for _ in range(8):
        s = seen_by_pid.get(ppid)
        if s is None:
            return "other"
        c = s.cmdline
        if "spark_jobs.cli" in c or "faulty_detect" in c:
            for word, name in ((" detect ", "detection job"), (" archive ", "archive job"),
                               (" connect ", "Connect server"), (" backtest ", "rulectl backtest")):
                if word in c + " ":
                    return name
        if "airflow" in c and "xdist" not in c:
            return "Airflow tasks"
        if "xdist" in c or "pytest" in c:
            return "test sessions"
        ppid = s.ppid
    return "other"


# Airflow's processes by the title they set (`airflow <command>`, and its task processes'
# `airflow task supervisor: ...`, `airflow task runner: ...`, `airflow worker -- ...`);
# the tests also run whole DAGs in one process (`airflow dags test`).
AIRFLOW_ROLES = (("task runner", "tasks"), ("task supervisor", "tasks"), ("dags test", "dags test"),
                 ("db migrate", "db migrate"), ("dag-processor", "DAG processor"),
                 ("dag_processor", "DAG processor"), ("scheduler", "scheduler"), ("api-server", "API server"),
                 ("api_server", "API server"), ("triggerer", "triggerer"), ("worker", "executor"))


def _airflow_role(cmdline: str) -> str:
    for word, role in AIRFLOW_ROLES:
        if word in cmdline:
            return role
    return "other"


def component(s: Seen, seen_by_pid: dict[int, Seen]) -> str:
    c = s.cmdline
    if "java" in c.split(" ", 1)[0]:
        if "kafka.Kafka" in c:
            return "Kafka brokers"
        if "org.apache.spark.deploy.SparkSubmit" in c or "SparkConnectServer" in c:
            return "Spark: " + _owner(seen_by_pid, s.ppid)
        if "org.apache.spark" in c:
            return "Spark: standalone cluster"
        return "other JVMs"
    if "airflow" in c and "xdist" not in c and "pytest" not in c:
        return "Airflow: " + _airflow_role(c)
    if "xdist" in c or "pytest" in c:
        return "pytest workers"
    if "spark_jobs.cli" in c:
        return "rulectl (Python)"
    if "chrom" in c:
        return "Chromium"
    if "postgres" in c:
        return "PostgreSQL"
    return "other"


def by_component(seen: dict[tuple[int, float], Seen]) -> tuple[Counter[str], Counter[str]]:
    """CPU seconds spent since the first sample, summed by `component`, and how many of
    its processes took a second of CPU or more: for a JVM component, how many JVMs
    started, each paying its start-up."""
    by_pid = {pid: s for (pid, _), s in seen.items()}
    cpu: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for s in seen.values():
        name = component(s, by_pid)
        cpu[name] += s.cpu - s.base_cpu
        count[name] += s.cpu - s.base_cpu >= 1.0
    return cpu, count


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", nargs="*", help="what to run (default: make test)")
    args = ap.parse_args()
    argv = args.command or ["make", "test"]
    seen: dict[tuple[int, float], Seen] = {}
    sample(seen, first=True)
    stop = threading.Event()

    def sampler() -> None:
        while not stop.wait(SAMPLE_S):
            sample(seen, first=False)

    thread = threading.Thread(target=sampler, daemon=True)
    started = time.monotonic()
    thread.start()
    code = subprocess.call(argv, cwd=ROOT)
    wall = time.monotonic() - started
    stop.set()
    thread.join()
    sample(seen, first=False)

    cpu, count = by_component(seen)
    total = sum(cpu.values())
    cores = psutil.cpu_count() or 1
    print(f"\n{' '.join(argv)}: exit {code}, {wall:.0f} s wall, {total:.0f} CPU s, "
          f"busy {total / (wall * cores):.0%} of {cores} cores")
    for name, secs in cpu.most_common():
        print(f"  {secs:8.0f} s  {secs / total:5.1%}  {name} ({count[name]} processes)")
    figures = {"wall_s": round(wall), "cpu_s": round(total), "busy": round(total / (wall * cores), 2),
               "exit_code": code, "cpu_by_component_s": {k: round(v) for k, v in cpu.most_common()},
               "processes_by_component": {k: count[k] for k, _ in cpu.most_common() if count[k]},
               "largest": [f"{k} {v:.0f}" for k, v in cpu.most_common(6)]}
    # The settings that change what the JVMs do, when the run was given any.
    given = {k: os.environ[k] for k in ENV_NOTED if k in os.environ}
    append_result("suite_cpu", figures, tested=" ".join(argv), **({"env": given} if given else {}))
    return code


if __name__ == "__main__":
    sys.exit(main())
