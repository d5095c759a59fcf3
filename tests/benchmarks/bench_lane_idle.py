"""What an idle detection job costs with its threshold rules in each lane, by the number
of source partitions: the real-time lane keeps one task per partition running, the
micro-batch query runs nothing while no record arrives.

One broker; `--topics` topics of one partition, a threshold rule on each, no events.
After `--warmup` seconds, the job JVM's CPU over `--seconds` (cores), for each lane and
topic count, one after the other:

    .venv/bin/python tests/benchmarks/bench_lane_idle.py [--topics 2 130]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_idle_job import _cpu, job_jvm  # noqa: E402
from record import append_result  # noqa: E402


def idle_cores(bootstrap: str, lane: str, work: Path, args: argparse.Namespace) -> float:
    with job_jvm(["-m", "spark_jobs.cli", "detect", "--bootstrap", bootstrap, "--checkpoint", str(work / "checkpoint"),
                  "--threshold-lane", lane]) as jvm:
        time.sleep(args.warmup)
        c0, t0 = _cpu(jvm), time.monotonic()
        time.sleep(args.seconds)
        return round((_cpu(jvm) - c0) / (time.monotonic() - t0), 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topics", type=int, nargs="+", default=[2, 130])
    ap.add_argument("--warmup", type=float, default=30)
    ap.add_argument("--seconds", type=float, default=30)
    args = ap.parse_args()
    from spark_jobs.kafka.admin import TopicSpec, create_topics
    from spark_jobs.kafka.broker import EmbeddedBroker, free_port
    from spark_jobs.kafka.publisher import publish_rules
    from spark_jobs.rules.model import parse_rule

    for n in args.topics:
        figures: dict[str, object] = {}
        with tempfile.TemporaryDirectory() as tmp, EmbeddedBroker(port=free_port()) as broker:
            topics = [f"idle{i:04d}" for i in range(n)]
            create_topics(broker.bootstrap, {t: TopicSpec(partitions=1) for t in topics})
            publish_rules([parse_rule({"rule_id": f"big_{t}", "version": "1", "rule_type": "threshold",
                                       "source_topic": t,
                                       "conditions": [{"field": "amount", "operator": ">", "value": 100}]})
                           for t in topics], broker.bootstrap)
            for lane in ("micro-batch", "real-time"):
                figures[f"{lane.replace('-', '_')}_job_jvm_cores"] = idle_cores(
                    broker.bootstrap, lane, Path(tmp) / lane, args)
        print(f"{n} partitions: {figures}")
        append_result("lane_idle", figures, partitions=n, seconds=args.seconds)


if __name__ == "__main__":
    main()
