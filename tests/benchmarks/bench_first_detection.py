"""Seconds from `rulectl detect` starting to its first detection on the sink.

    python tests/benchmarks/bench_first_detection.py [--runs 2]

Starts a real Apache Kafka broker, publishes the repository's rules (`rules/`) through
the release path's publisher, produces the demo events, then starts `rulectl detect`
in its own process (its own Spark) on a fresh checkpoint and times, from the moment the
process is started: the job's first completed micro-batch (in its status file) and the
first detection on the sink. Runs more than once; the later runs are on a warm machine
(the OS file cache holds the jars and the Python packages).
"""

from __future__ import annotations

import argparse
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "benchmarks"), str(ROOT)]
from detect_harness import DetectJob, detections, produce  # noqa: E402
from record import append_result  # noqa: E402

from spark_jobs.kafka.broker import EmbeddedBroker, free_port  # noqa: E402
from spark_jobs.kafka.publisher import publish_rules  # noqa: E402
from spark_jobs.rules.loader import load_rules  # noqa: E402


def one_run(bootstrap: str, work: Path) -> tuple[float, float]:
    job = DetectJob(bootstrap, work)
    t0 = time.monotonic()
    job.start(timeout=300)  # returns once the status shows a completed micro-batch
    first_batch = time.monotonic() - t0
    while not detections(bootstrap, "events.processed"):
        if time.monotonic() - t0 > 300:
            raise TimeoutError("no detection within 300 s")
        time.sleep(0.2)
    first = time.monotonic() - t0
    job.stop()
    return first_batch, first


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    print(f"machine: {platform.machine()}, python {platform.python_version()}, Spark local[2]")
    for n in range(args.runs):
        work = Path(tempfile.mkdtemp(prefix="bench-first-"))
        with EmbeddedBroker(port=free_port(), data_dir=work / "kafka") as broker:
            publish_rules([lr.rule for lr in load_rules([ROOT / "rules"]).rules], broker.bootstrap)
            for topic in ("events.raw", "context.raw"):
                lines = (ROOT / "tests" / "data" / "demo" / f"{topic}.jsonl").read_text().splitlines()
                produce(broker.bootstrap, topic, lines)
            batch, first = one_run(broker.bootstrap, work / "job")
            print(f"run {n + 1}: first micro-batch done after {batch:.1f} s, first detection on the sink after "
                  f"{first:.1f} s (see {work / 'job' / 'detect.log'} for the query's start)", flush=True)
            append_result("first_detection", {"first_batch_s": round(batch, 1), "first_detection_s": round(first, 1)},
                          run=n + 1)


if __name__ == "__main__":
    main()
