"""What a detection job's start costs: CPU seconds from `rulectl detect` starting to its
first completed micro-batch, by the JVM's thread groups, and what it spends idle after.

    .venv/bin/python tests/benchmarks/bench_job_start.py [--runs 2] [--idle 30] [--suite-jit]

A real broker with the repository's rules published and one event a topic; the job (the
test harness's `DetectJob`, so the suite's settings) starts on a fresh checkpoint, with
and without the class archive alternately (`RULES_CDS=off`), `--runs` times each. The
test suite starts dozens of these; set against `bench_suite_cpu.py`'s CPU and process
count for the detection jobs, it says how much of their CPU is start-up.
`--suite-jit` gives the JVMs the suite's JIT setting (tests/conftest.py: C1 only).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "benchmarks"), str(ROOT)]
import psutil  # noqa: E402
from bench_idle_job import _cpu, _threads  # noqa: E402
from detect_harness import DetectJob, produce  # noqa: E402
from record import append_result  # noqa: E402

from spark_jobs.kafka.broker import EmbeddedBroker, free_port  # noqa: E402
from spark_jobs.kafka.publisher import publish_rules  # noqa: E402
from spark_jobs.rules.loader import load_rules  # noqa: E402

SUITE_JIT = "-XX:TieredStopAtLevel=1"


def _groups(jvm: int) -> Counter[str]:
    out: Counter[str] = Counter()
    for group, cpu in _threads(jvm).values():
        out[group] += cpu
    return out


def one_start(bootstrap: str, work: Path, archive: bool, idle_s: float) -> dict:
    with mock.patch.dict(os.environ):  # the job inherits this process's environment
        os.environ.pop("RULES_CDS", None)
        if not archive:
            os.environ["RULES_CDS"] = "off"
        job = DetectJob(bootstrap, work)
        t0 = time.monotonic()
        job.start(timeout=300)  # returns once the status shows a completed micro-batch
        first_batch = time.monotonic() - t0
    assert job.proc is not None
    driver = psutil.Process(job.proc.pid)
    jvm = next(q.pid for q in driver.children(recursive=True) if q.name() == "java")
    at_start, groups = _cpu(jvm), _groups(jvm)
    time.sleep(idle_s)
    idle = (_cpu(jvm) - at_start) / idle_s
    python = sum(driver.cpu_times()[:2])
    job.stop()
    return {"first_batch_s": first_batch, "jvm_cpu_s": at_start, "python_cpu_s": python, "idle_cores": idle,
            **{f"{g}_cpu_s": v for g, v in groups.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--idle", type=float, default=30.0, help="seconds the job is watched idle after its first batch")
    ap.add_argument("--suite-jit", action="store_true", help=f"JAVA_TOOL_OPTIONS={SUITE_JIT}, as the tests run")
    args = ap.parse_args()
    if args.suite_jit:
        os.environ["JAVA_TOOL_OPTIONS"] = SUITE_JIT
    from spark_jobs.jvm.class_archive import ensure_archive

    ensure_archive("spark")
    runs: dict[bool, list[dict]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="bench-job-start-") as tmp:
        work = Path(tmp)
        with EmbeddedBroker(port=free_port(), data_dir=work / "kafka") as broker:
            publish_rules([lr.rule for lr in load_rules([ROOT / "rules"]).rules], broker.bootstrap)
            for topic in ("events.raw", "context.raw"):
                produce(broker.bootstrap, topic, ['{"type": "start"}'])
            for n in range(args.runs):
                for archive in (True, False):
                    r = one_start(broker.bootstrap, work / f"job-{n}-{archive}", archive, args.idle)
                    runs[archive].append(r)
                    print(f"run {n + 1}, archive {'on' if archive else 'off'}: first batch after "
                          f"{r['first_batch_s']:.1f} s, JVM {r['jvm_cpu_s']:.1f} CPU s (JIT {r.get('jit_cpu_s', 0):.1f}, "
                          f"tasks {r.get('tasks_cpu_s', 0):.1f}, queries {r.get('query_driver_cpu_s', 0):.1f}), "
                          f"driver's Python {r['python_cpu_s']:.1f}; then idle {r['idle_cores']:.3f} cores", flush=True)
    figures: dict[str, float] = {}
    for archive, name in ((True, "archive"), (False, "none")):
        for key in sorted({k for r in runs[archive] for k in r}):
            figures[f"{name}_{key}"] = round(statistics.median(r.get(key, 0.0) for r in runs[archive]), 3)
    append_result("job_start", figures, runs=args.runs, idle_s=args.idle,
                  jit=SUITE_JIT if args.suite_jit else "default")


if __name__ == "__main__":
    main()
