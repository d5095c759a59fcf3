"""Backlog drain: how fast the live job drains a backlog, against one plain Python
process doing the same rules on the same events, and that both detect the same.

    python tests/benchmarks/bench_backlog.py [--events 300000] [--keep DIR] [--max-offsets 100000]
                                             [--rule-copies N] [--warmup N] [--floor] [--event-log]

The 50 threshold and 10 event-time velocity rules of the backtest benchmark (and
`--rule-copies N` copies of them that each also ask for one user). The script

1. generates the benchmark's events (bench_backtest.prepare: in event-time order, 20k
   users) and keeps the threshold and velocity rules (no correlation, as the target);
2. starts an embedded broker and `rulectl detect` (local[2]) and waits until the job
   runs its (empty) first batch, so JVM start-up and the first plan are not the drain;
   with `--warmup N` the job then drains N events of its own first (warmup_file: the
   first N events a day earlier, with users of their own), so the timed drain is that
   of a job that has been running (its code compiled by the JIT), not of one just
   started; their detections are left out of the comparison;
3. produces the whole file to `events.raw` as fast as the producer goes and times from
   the first record sent until the job has read every record (lag 0 in a batch that
   started after the last one was acknowledged);
4. runs the same rules over the same file in one plain Python process (python_loop.py:
   each record parsed once, rules indexed, O(1) sliding windows), timed from its read
   of the file; it runs first, before the broker and the job start, so that nothing
   else is on the machine;
5. compares the detections the job wrote to `events.processed` with the loop's, per
   rule, and prints both rates and their ratio;
6. with `--floor`, then drains the same backlog, after the same warm-up, with the floor
   of Spark's own operators (`bench_live_floor.py --jvm-rules --backlog`: the threshold
   rules as one generated expression, the velocity rules as one native windowed
   aggregation, Spark's Kafka source and sink; less work than the job's) in its own
   process and broker, and prints the job's drain time as a multiple of the floor's.

`--event-log` writes the job's Spark event log and prints, per stage of the drain's
batches (stage_times.py), wall and CPU time, shuffle rows and the state store's bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
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
from stage_times import event_log_conf, keyed_stage_times  # noqa: E402

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


# Warm-up events come a day before the backlog: older than any window its events reach.
WARMUP_SHIFT_MS = 86_400_000


def warmup_file(ev: Path, n: int) -> Path:
    """The first `n` events of `ev` a day earlier and with users of their own ("w" for
    "u"), next to it: traffic that runs every part of the job (and has the JIT compile
    it) before the timed backlog, without entering the backlog's windows or keys."""
    out = ev.with_name(f"warmup-{n}.jsonl")
    if not out.exists():
        with ev.open(encoding="utf-8") as src, out.open("w", encoding="utf-8") as dst:
            for _, line in zip(range(n), src, strict=False):
                e = json.loads(line)
                e["ts"] -= WARMUP_SHIFT_MS
                e["user_id"] = "w" + e["user_id"][1:]
                dst.write(json.dumps(e, separators=(",", ":")) + "\n")
    return out


def drained_after(acked_at: str):  # noqa: ANN201 - a status predicate
    """Each query (the keyed one and, with its own progress, the real-time lane) has run
    a batch that started after `acked_at` and read everything there was."""
    def drained(s: dict) -> bool:
        lane = s.get("threshold_lane") or {}
        queries = [s, lane] if lane.get("mode") == "real-time" else [s]
        return all((q.get("last_batch_time") or "") > acked_at and q.get("lag") == 0 for q in queries)
    return drained


def produce_and_drain(job: DetectJob, bootstrap: str, path: Path, timeout: float) -> tuple[int, float, float]:
    """Produce the file and wait until the job has drained it: (records, produce s, drain s)."""
    start = time.time()
    n, produced_s = produce_file(bootstrap, path)
    acked_at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 1))
    job.wait_for(drained_after(acked_at), timeout=timeout)
    return n, produced_s, time.time() - start


def detections(bootstrap: str) -> set[tuple[str, str]]:
    return {(d["rule_id"], d["detection_id"])
            for d in (json.loads(r.value) for r in read_all(bootstrap, "events.processed", timeout=300))}


def floor_drain(work: Path, args: argparse.Namespace) -> float:
    """bench_live_floor.py's drain of the same backlog after the same warm-up, in its own
    process (its own broker and Spark): the seconds it printed."""
    cmd = [sys.executable, str(Path(__file__).with_name("bench_live_floor.py")), "--jvm-rules",
           "--backlog", str(args.events), "--keep", str(work), "--warmup", str(args.warmup),
           "--max-offsets", str(args.max_offsets), "--trigger-ms", str(args.trigger_ms)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=args.timeout).stdout
    found = re.search(r"drained \(every record read and written\) after ([0-9.]+)s", out)
    if found is None:
        raise RuntimeError(f"bench_live_floor.py printed no drain time:\n{out}")
    return float(found.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--keep", type=Path, help="use/generate the files in DIR (bench_backtest.py --keep layout)")
    ap.add_argument("--max-offsets", type=int, default=100_000, help="the job's --max-offsets-per-trigger")
    ap.add_argument("--trigger-ms", type=int, default=500)
    ap.add_argument("--timeout", type=int, default=1800)
    ap.add_argument("--threshold-lane", choices=["micro-batch", "real-time"], default="micro-batch",
                    help="rulectl detect --threshold-lane")
    ap.add_argument("--rule-copies", type=int, default=0,
                    help="more rules: copies of the threshold and velocity rules, each asking for one user")
    ap.add_argument("--warmup", type=int, default=0, metavar="N",
                    help="drain N warm-up events first (module docstring), untimed")
    ap.add_argument("--floor", action="store_true",
                    help="then the floor of Spark's own operators on the same backlog (module docstring)")
    ap.add_argument("--event-log", action="store_true",
                    help="write the job's Spark event log and print where the drain's batches spent their time")
    args = ap.parse_args()

    work, ev, _ = prepare(args.keep, args.events, "bench-backlog-", args.rule_copies)
    rules_dir = threshold_and_velocity(work)
    rules = [lr.rule for lr in load_rules([rules_dir]).rules]
    job_dir = Path(tempfile.mkdtemp(prefix="bench-backlog-job-"))
    if args.event_log:
        # The job is its own process: it reads spark-defaults.conf from $SPARK_CONF_DIR
        # (set while it starts, so the floor's process does not write one too).
        (job_dir / "spark-conf").mkdir()
        (job_dir / "event-log").mkdir()
        (job_dir / "spark-conf" / "spark-defaults.conf").write_text(event_log_conf(job_dir / "event-log"))
    # First, alone on the machine (no broker or JVM yet, none exiting).
    loop_s, found = run_loop(rules_dir, [("events.raw", ev)])

    with EmbeddedBroker(port=free_port()) as broker:
        create_topics(broker.bootstrap, ["events.raw"])
        publish_rules([parse_rule(r.model_dump(mode="json")) for r in rules], broker.bootstrap)
        job = DetectJob(broker.bootstrap, job_dir, trigger_ms=args.trigger_ms,
                        max_offsets_per_trigger=args.max_offsets,
                        extra_args=("--threshold-lane", args.threshold_lane))
        t = time.time()
        conf_dir = os.environ.get("SPARK_CONF_DIR")
        if args.event_log:
            os.environ["SPARK_CONF_DIR"] = str(job_dir / "spark-conf")
        try:
            job.start(timeout=300)
        finally:
            if args.event_log:
                os.environ.pop("SPARK_CONF_DIR")
                if conf_dir is not None:
                    os.environ["SPARK_CONF_DIR"] = conf_dir
        warm_s = time.time() - t
        before: set[tuple[str, str]] = set()
        if args.warmup:
            _, _, warmup_s = produce_and_drain(job, broker.bootstrap, warmup_file(ev, args.warmup), args.timeout)
            job.batches_after(1, timeout=120)
            before = detections(broker.bootstrap)
            print(f"warm-up: {args.warmup} events drained in {warmup_s:.1f}s, {len(before)} detections")
        drain_from_ms = int(time.time() * 1000)
        n, produced_s, drain_s = produce_and_drain(job, broker.bootstrap, ev, args.timeout)
        # Every batch that read input has written its detections when the next one starts.
        job.batches_after(1, timeout=120)
        job.stop()
        live = detections(broker.bootstrap) - before

    per_rule = Counter(r for r, _ in live)
    equal = all(per_rule.get(r.rule_id, 0) == found.get(r.rule_id, 0) for r in rules)
    floor_s = floor_drain(work, args) if args.floor else None

    print(f"machine: {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}, "
          f"Spark local[2], trigger {args.trigger_ms} ms, max offsets per trigger {args.max_offsets}, "
          f"threshold lane {args.threshold_lane}, load average {os.getloadavg()[0]:.1f}")
    print(f"rules: {len(rules)} (threshold + event-time velocity); events: {n}; warm-up events: {args.warmup}")
    print(f"job warm (first empty batch) after {warm_s:.1f}s; produced {n} records in {produced_s:.1f}s")
    print(f"live job drained the backlog in {drain_s:.1f}s -> {n / drain_s:,.0f} events/s; the Python loop took "
          f"{loop_s:.1f}s -> {n / loop_s:,.0f} events/s; the job {loop_s / drain_s:.2f}x the loop")
    stages = {}
    if args.event_log:
        stages = {"keyed_stages": keyed_stage_times(job_dir / "event-log", drain_from_ms)}
        for name, f in stages["keyed_stages"].items():
            print(f"the drain's batches, {name}: " + ", ".join(f"{k} {v:,}" for k, v in f.items()))
    floor = {}
    if floor_s is not None:
        floor = {"floor_s": floor_s, "floor_ratio": round(drain_s / floor_s, 2),
                 "floor_loop_ratio": round(loop_s / floor_s, 2)}
        print(f"the floor (Spark's own operators, bench_live_floor.py --jvm-rules) drained it in {floor_s:.1f}s "
              f"({loop_s / floor_s:.2f}x the loop); the job took {drain_s / floor_s:.2f}x the floor's time")
    append_result("backlog", {"events_per_s": round(n / drain_s), "drain_s": round(drain_s, 1),
                              "warm_s": round(warm_s, 1), "produced_s": round(produced_s, 1),
                              "detections": len(live), "loop_s": round(loop_s, 1),
                              "loop_ratio": round(loop_s / drain_s, 2), "detections_equal_loop": equal, **floor,
                              **stages},
                  events=n, rules=len(rules), trigger_ms=args.trigger_ms, max_offsets=args.max_offsets,
                  warmup=args.warmup, threshold_lane=args.threshold_lane)
    if equal:
        print(f"detections: EQUAL to the loop's per rule ({len(live)})")
    else:
        print(f"detections: DIFFERENT: live {dict(per_rule)}, loop {dict(found)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
