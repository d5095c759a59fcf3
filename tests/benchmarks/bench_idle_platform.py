"""What `rulectl up` costs the machine while nothing happens but the demo: the platform
started in a fresh work folder on free ports (broker, Airflow on its default metadata
DB, detection job, event archive, Spark Connect server, demo), and after `--warmup`
seconds of running, `--seconds` of every process's CPU summed by what it is (the same
grouping as bench_suite_cpu.py), in cores. This is what a laptop running `make up`
gives up, and what every platform test of the suite pays while it waits.

    .venv/bin/python tests/benchmarks/bench_idle_platform.py [--archive-trigger-ms 5000] [-- more rulectl up options]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_release import stop_platform  # noqa: E402
from bench_suite_cpu import Seen, by_component, sample  # noqa: E402
from record import append_result  # noqa: E402


def _wait_for(log: Path, text: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in log.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"rulectl up exited:\n{log.read_text(errors='replace')[-4000:]}")
        time.sleep(1)
    raise RuntimeError(f"no {text!r} within {timeout} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warmup", type=float, default=90, help="seconds of running before the measurement")
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--archive-trigger-ms", type=int, default=None, help="rulectl up --archive-trigger-ms")
    ap.add_argument("up_args", nargs="*", help="more `rulectl up` options (after --)")
    args = ap.parse_args()
    from spark_jobs.kafka.broker import free_port

    up_args = list(args.up_args)
    if args.archive_trigger_ms is not None:
        up_args += ["--archive-trigger-ms", str(args.archive_trigger_ms)]
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "up.log"
        argv = [sys.executable, "-m", "spark_jobs.cli", "up", "--workdir", str(Path(tmp) / "var"),
                "--port", str(free_port()), "--airflow-port", str(free_port()),
                "--connect-port", str(free_port()), *up_args]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "AIRFLOW", "RULE"))}
        with log.open("wb") as out:
            proc = subprocess.Popen(argv, cwd=tmp, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            _wait_for(log, "detection job running", proc, 600)
            time.sleep(args.warmup)
            seen: dict[tuple[int, float], Seen] = {}
            sample(seen, first=True)
            started = time.monotonic()
            while time.monotonic() - started < args.seconds:
                time.sleep(2.0)
                sample(seen, first=False)
            wall = time.monotonic() - started
        finally:
            stop_platform(proc)
    cpu_by_component, _ = by_component(seen)
    cores = {name: cpu / wall for name, cpu in cpu_by_component.items()}
    total = sum(cores.values())
    print(f"idle platform: {total:.2f} cores over {wall:.0f} s")
    for name, c in sorted(cores.items(), key=lambda x: -x[1]):
        print(f"  {c:6.3f}  {name}")
    append_result("idle_platform", {
        "total_cores": round(total, 2),
        "detection_job_cores": round(cores.get("Spark: detection job", 0.0), 3),
        "archive_job_cores": round(cores.get("Spark: archive job", 0.0), 3),
        "cores_by_component": {k: round(v, 3) for k, v in sorted(cores.items(), key=lambda x: -x[1])},
    }, seconds=args.seconds, warmup=args.warmup, archive_trigger_ms=args.archive_trigger_ms, up_args=" ".join(up_args))


if __name__ == "__main__":
    main()
