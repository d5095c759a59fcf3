"""What a detection job costs the machine at the demo's trickle of events, with its
checkpoint written as the job writes it (`spark.LOCAL_CHECKPOINT_CONF`: Hadoop's
FileSystem API over the platform's local file system, which sets permissions without a
`chmod` process), through the FileSystem API over Hadoop's own local file system
(`chmod`), and through Spark's default FileContext manager.

One broker (plaintext), the demo's rules, the demo generator at `--rate` events/s and a
detection job; after `--warmup` seconds, `--seconds` of: the machine's busy cores
(/proc/stat), processes started per second (the `processes` counter: each `chmod` or
`readlink` that Hadoop's local file system starts is one), the job JVM's own CPU and its
last batch's durations. The variants run one after the other on fresh checkpoints.
`--jfr` records that window with JDK Flight Recorder (jfr_profile.py) and adds, per
thread group, the methods it spent its samples in.

    .venv/bin/python tests/benchmarks/bench_idle_job.py [--rate 20] [--seconds 60]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import jfr_profile  # noqa: E402
from record import ROOT, append_result  # noqa: E402

_JOB = (
    "import sys, spark_jobs.spark as s\n"
    "if sys.argv[1] == 'filecontext': s.LOCAL_CHECKPOINT_CONF.clear()\n"
    "if sys.argv[1] in ('filecontext', 'chmod'): s.FORKLESS_LOCAL_FS = None\n"
    "from spark_jobs.cli import main\n"
    "sys.exit(main(sys.argv[2:]))\n"
)


VARIANTS = ("filesystem", "chmod", "filecontext")


def _machine() -> tuple[int, int]:
    fields = Path("/proc/stat").read_text().splitlines()
    cpu = [int(x) for x in fields[0].split()[1:]]
    busy = sum(cpu) - cpu[3] - cpu[4]  # all but idle and iowait
    forks = next(int(line.split()[1]) for line in fields if line.startswith("processes"))
    return busy, forks


def _cpu(pid: int, stat: Path | None = None) -> float:
    """CPU seconds (user + system) of process `pid`, or of the thread whose /proc `stat` is given."""
    st = (stat or Path(f"/proc/{pid}/stat")).read_text().rsplit(")", 1)[1].split()
    return (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK")


def _jvm_of() -> int:
    for _ in range(600):
        for p in Path("/proc").iterdir():
            if p.name.isdigit():
                try:
                    cmd = (p / "cmdline").read_text()
                    # the driver JVM, not Spark's launcher (a java process that exits at once)
                    if "spark.app.name=detection-job" in cmd and "deploy.SparkSubmit" in cmd:
                        return int(p.name)
                except OSError:
                    continue
        time.sleep(0.5)
    raise RuntimeError("no detection job JVM")


# The job JVM's threads by what they do (their names, as /proc gives them: 15 characters).
THREAD_GROUPS = (("CompilerThre", "jit"), ("Executor task", "tasks"), ("stream executio", "query_driver"),
                 ("GC Thread", "gc"))


def _threads(pid: int) -> dict[str, tuple[str, float]]:
    """Per thread id: its group (THREAD_GROUPS, else "other") and its CPU seconds."""
    out: dict[str, tuple[str, float]] = {}
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (t / "comm").read_text().strip()
            cpu = _cpu(pid, t / "stat")
        except OSError:
            continue
        group = jfr_profile.thread_group(name, THREAD_GROUPS)
        out[t.name] = (group, cpu)
    return out


def _classes_loaded(pid: int) -> int:
    """Classes the JVM has loaded so far (`jstat -class`). Spark compiles generated code
    into new classes; a count that keeps rising after the warm-up is code generated and
    compiled again at every batch instead of being taken from Spark's code cache."""
    out = subprocess.run(["jstat", "-class", str(pid)], capture_output=True, text=True, check=True).stdout
    return int(out.splitlines()[1].split()[0])


@contextmanager
def job_jvm(argv: list[str]) -> Iterator[int]:
    """Start `python argv` (a detection job) and give its driver JVM's pid; on leaving,
    stop it and wait for that JVM to be gone, so that the next run cannot find it."""
    job = subprocess.Popen([sys.executable, *argv], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    jvm = 0
    try:
        jvm = _jvm_of()
        yield jvm
    finally:
        job.terminate()
        job.wait(120)
        while jvm and Path(f"/proc/{jvm}").exists():
            time.sleep(0.5)


def run(variant: str, bootstrap: str, work: Path, args: argparse.Namespace) -> dict:
    status = work / "status.json"
    with job_jvm(["-c", _JOB, variant, "detect", "--bootstrap", bootstrap, "--checkpoint", str(work / "checkpoint"),
                  "--status-file", str(status), "--threshold-lane", args.threshold_lane]) as jvm:
        time.sleep(args.warmup)
        tck = os.sysconf("SC_CLK_TCK")
        (b0, f0), c0, t0, th0, k0 = _machine(), _cpu(jvm), time.monotonic(), _threads(jvm), _classes_loaded(jvm)
        n0 = json.loads(status.read_text()).get("last_batch_id") or 0
        if args.jfr:
            profile = jfr_profile.record(jvm, args.seconds, THREAD_GROUPS)
        else:
            profile = None
            time.sleep(args.seconds)
        (b1, f1), c1, t1, th1, k1 = _machine(), _cpu(jvm), time.monotonic(), _threads(jvm), _classes_loaded(jvm)
        groups = dict.fromkeys([g for _, g in THREAD_GROUPS] + ["other"], 0.0)
        for tid, (group, cpu) in th1.items():
            groups[group] += (cpu - th0.get(tid, (group, 0.0))[1]) / (t1 - t0)
        last = json.loads(status.read_text())
        return {
            "busy_cores": round((b1 - b0) / tck / (t1 - t0), 3),
            "processes_per_s": round((f1 - f0) / (t1 - t0), 1),
            "job_jvm_cores": round((c1 - c0) / (t1 - t0), 3),
            # of it, by thread: HotSpot's JIT compilers, Spark's tasks, the queries' own
            # threads (planning each micro-batch), GC, the rest
            **{f"{g}_cores": round(v, 3) for g, v in groups.items()},
            "classes_loaded_per_s": round((k1 - k0) / (t1 - t0), 2),
            "keyed_batches_per_s": round(((last.get("last_batch_id") or 0) - n0) / (t1 - t0), 2),
            "batch_ms": last.get("batch_duration_ms", {}).get("triggerExecution"),
            "wal_commit_ms": last.get("batch_duration_ms", {}).get("walCommit"),
            **({"profile": profile} if args.jfr else {}),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=int, default=20)
    ap.add_argument("--warmup", type=float, default=60)
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--threshold-lane", choices=["micro-batch", "real-time"], default="micro-batch",
                    help="rulectl detect --threshold-lane (rulectl up runs real-time)")
    ap.add_argument("--jfr", action="store_true",
                    help="record the measurement window with JDK Flight Recorder: the methods each thread group spends it in")
    args = ap.parse_args()
    from spark_jobs.kafka.broker import EmbeddedBroker, free_port
    from spark_jobs.kafka.publisher import publish_rules
    from spark_jobs.rules.loader import load_rules

    figures: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker(port=free_port(), partitions=2) as broker:
        publish_rules([lr.rule for lr in load_rules([ROOT / "rules"]).rules], broker.bootstrap)
        demo = subprocess.Popen([sys.executable, "-m", "spark_jobs.cli", "demo", "--bootstrap", broker.bootstrap,
                                 "--forever", "--rate", str(args.rate)], cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            for variant in args.variants:
                out = run(variant, broker.bootstrap, Path(tmp) / variant, args)
                print(variant, json.dumps(out, indent=1))
                figures.update({f"{variant}_{k}": v for k, v in out.items()})
        finally:
            demo.terminate()
            demo.wait(60)
    append_result("idle_job", figures, rate=args.rate, seconds=args.seconds, threshold_lane=args.threshold_lane)


if __name__ == "__main__":
    main()
