"""What an idle detection job costs with its threshold rules in each lane, by the number
of source partitions: the real-time lane keeps one task per partition running, the
micro-batch query runs nothing while no record arrives.

One broker; `--topics` topics of one partition, a threshold rule on each, no events.
After `--warmup` seconds, the job JVM's and the broker's CPU over `--seconds` (cores), for each lane and
topic count, one after the other. `--jfr` also records the real-time lane's window with
JDK Flight Recorder (jfr_profile.py): per thread group, where its samples land; its cores
are then the lane's under the recorder.

    .venv/bin/python tests/benchmarks/bench_lane_idle.py [--topics 2 130] [--jfr] [--lanes real-time]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import jfr_profile  # noqa: E402
from bench_idle_job import THREAD_GROUPS, _cpu, job_jvm  # noqa: E402
from record import append_result  # noqa: E402

from spark_jobs.streaming.job import LANE_FETCH  # noqa: E402
from spark_jobs.streaming.threshold_lane import LANE_BATCH_MS  # noqa: E402


def idle_cores(bootstrap: str, broker: int, lane: str, work: Path, args: argparse.Namespace,
               profile: dict | None = None) -> tuple[float, float]:
    """The job JVM's and the broker's cores over the window (the broker's: serving the
    job's idle consumers); with `profile` (a dict), JFR records the window and its
    summary goes there."""
    with job_jvm(["-m", "spark_jobs.cli", "detect", "--bootstrap", bootstrap, "--checkpoint", str(work / "checkpoint"),
                  "--threshold-lane", lane]) as jvm:
        time.sleep(args.warmup)
        c0, b0, t0 = _cpu(jvm), _cpu(broker), time.monotonic()
        if profile is not None:
            profile.update(jfr_profile.record(jvm, args.seconds, THREAD_GROUPS))
        else:
            time.sleep(args.seconds)
        wall = time.monotonic() - t0
        return round((_cpu(jvm) - c0) / wall, 3), round((_cpu(broker) - b0) / wall, 3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--topics", type=int, nargs="+", default=[2, 130])
    ap.add_argument("--warmup", type=float, default=30)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--jfr", action="store_true", help="profile the real-time lane's window (JDK Flight Recorder)")
    ap.add_argument("--lanes", nargs="+", choices=["micro-batch", "real-time"], default=["micro-batch", "real-time"])
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
            profile: dict | None = {} if args.jfr else None
            for lane in args.lanes:
                name = lane.replace("-", "_")
                assert broker.pid is not None
                figures[f"{name}_job_jvm_cores"], figures[f"{name}_broker_cores"] = idle_cores(
                    broker.bootstrap, broker.pid, lane, Path(tmp) / lane, args, profile if lane == "real-time" else None)
        print(f"{n} partitions: {figures}")
        if profile:
            print(json.dumps(profile, indent=1))
        append_result("lane_idle", {**figures, **({"profile": profile} if profile else {})}, partitions=n,
                      seconds=args.seconds, jfr=args.jfr, lane_fetch_wait_ms=int(LANE_FETCH["kafka.fetch.max.wait.ms"]),
                      lane_batch_ms=LANE_BATCH_MS)


if __name__ == "__main__":
    main()
