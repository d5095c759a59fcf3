"""Backlog drain: how fast the live job drains a backlog, against one plain Python
process doing the same rules on the same events, and that both detect the same.

    python tests/benchmarks/bench_backlog.py [--events 300000] [--keep DIR] [--max-offsets 100000] [--rule-copies N]

The 50 threshold and 10 event-time velocity rules of the backtest benchmark (and
`--rule-copies N` copies of them that each also ask for one user). The script

1. generates the benchmark's events (bench_backtest.prepare: in event-time order, 20k
   users) and keeps the threshold and velocity rules (no correlation, as the target);
2. starts an embedded broker and `rulectl detect` (local[2]) and waits until the job
   runs its (empty) first batch, so JVM start-up and the first plan are not the drain;
3. produces the whole file to `events.raw` as fast as the producer goes and times from
   the first record sent until the job has read every record (lag 0 in a batch that
   started after the last one was acknowledged);
4. after the job stopped, runs the same rules over the same file in one plain Python
   process (python_loop.py: each record parsed once, rules indexed, O(1) sliding
   windows), timed from its read of the file, and
5. compares the detections the job wrote to `events.processed` with the loop's, per
   rule, and prints both rates and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import yaml
from confluent_kafka import Producer

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from bench_backtest import prepare  # noqa: E402
from detect_harness import DetectJob  # noqa: E402
from python_loop import run as run_loop  # noqa: E402
from record import append_result  # noqa: E402

from spark_jobs.kafka.admin import create_topics, read_all  # noqa: E402
from spark_jobs.kafka.broker import EmbeddedBroker, free_port  # noqa: E402
from spark_jobs.kafka.publisher import publish_rules  # noqa: E402
from spark_jobs.rules.loader import load_rules  # noqa: E402
from spark_jobs.rules.model import parse_rule  # noqa: E402


def threshold_and_velocity(work: Path) -> Path:
    """The benchmark's rules without its two correlation rules, in a folder of their own."""
    rules = [r for r in yaml.safe_load((work / "rules" / "bench.yaml").read_text()) if r["rule_type"] != "correlation"]
    out = work / "rules_backlog"
    out.mkdir(exist_ok=True)
    (out / "bench.yaml").write_text(yaml.safe_dump(rules))
    return out


def produce_file(bootstrap: str, path: Path) -> tuple[int, float]:
    """Every line of `path` as one record of events.raw, unchanged (the detection ids
    hash the text); returns (records, seconds until all were acknowledged)."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 50, "batch.num.messages": 10_000,
                  "queue.buffering.max.messages": 1_000_000, "compression.type": "lz4"})
    n, start = 0, time.time()
    with path.open("rb") as f:
        for line in f:
            value = line.rstrip(b"\r\n")
            while True:
                try:
                    p.produce("events.raw", value=value)
                    break
                except BufferError:
                    p.poll(0.05)
            n += 1
            if n % 10_000 == 0:
                p.poll(0)
    if p.flush(120) != 0:
        raise RuntimeError("the producer could not deliver every record")
    return n, time.time() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--keep", type=Path, help="use/generate the files in DIR (bench_backtest.py --keep layout)")
    ap.add_argument("--max-offsets", type=int, default=100_000, help="the job's --max-offsets-per-trigger")
    ap.add_argument("--trigger-ms", type=int, default=500)
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--rule-copies", type=int, default=0,
                    help="more rules: copies of the threshold and velocity rules, each asking for one user")
    args = ap.parse_args()

    work, ev, _ = prepare(args.keep, args.events, "bench-backlog-", args.rule_copies)
    rules_dir = threshold_and_velocity(work)
    rules = [lr.rule for lr in load_rules([rules_dir]).rules]
    job_dir = Path(tempfile.mkdtemp(prefix="bench-backlog-job-"))

    with EmbeddedBroker(port=free_port()) as broker:
        create_topics(broker.bootstrap, ["events.raw"])
        publish_rules([parse_rule(r.model_dump(mode="json")) for r in rules], broker.bootstrap)
        job = DetectJob(broker.bootstrap, job_dir, trigger_ms=args.trigger_ms,
                        max_offsets_per_trigger=args.max_offsets)
        t = time.time()
        job.start(timeout=300)
        warm_s = time.time() - t
        start = time.time()
        n, produced_s = produce_file(broker.bootstrap, ev)
        acked_at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 1))
        job.wait_for(lambda s: (s.get("last_batch_time") or "") > acked_at and s.get("lag") == 0,
                     timeout=args.timeout)
        drain_s = time.time() - start
        # Every batch that read input has written its detections when the next one starts.
        job.batches_after(1, timeout=120)
        job.stop()
        live = {(d["rule_id"], d["detection_id"])
                for d in (json.loads(r.value) for r in read_all(broker.bootstrap, "events.processed", timeout=300))}

    loop_s, found = run_loop(rules_dir, [("events.raw", ev)])
    per_rule = Counter(r for r, _ in live)
    equal = all(per_rule.get(r.rule_id, 0) == found.get(r.rule_id, 0) for r in rules)

    print(f"machine: {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}, "
          f"Spark local[2], trigger {args.trigger_ms} ms, max offsets per trigger {args.max_offsets}, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"rules: {len(rules)} (threshold + event-time velocity); events: {n}")
    print(f"job warm (first empty batch) after {warm_s:.1f}s; produced {n} records in {produced_s:.1f}s")
    print(f"live job drained the backlog in {drain_s:.1f}s -> {n / drain_s:,.0f} events/s; the Python loop took "
          f"{loop_s:.1f}s -> {n / loop_s:,.0f} events/s; the job {loop_s / drain_s:.2f}x the loop")
    append_result("backlog", {"events_per_s": round(n / drain_s), "drain_s": round(drain_s, 1),
                              "warm_s": round(warm_s, 1), "produced_s": round(produced_s, 1),
                              "detections": len(live), "loop_s": round(loop_s, 1),
                              "loop_ratio": round(loop_s / drain_s, 2), "detections_equal_loop": equal},
                  events=n, rules=len(rules), trigger_ms=args.trigger_ms, max_offsets=args.max_offsets)
    if equal:
        print(f"detections: EQUAL to the loop's per rule ({len(live)})")
    else:
        print(f"detections: DIFFERENT: live {dict(per_rule)}, loop {dict(found)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
