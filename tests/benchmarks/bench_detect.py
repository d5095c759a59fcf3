"""Live job throughput and latency through the broker, mixed rule set.

    python tests/benchmarks/bench_detect.py [--rate 20000] [--seconds 60] [--users 2000] [--warmup 0]
                                            [--rare-rules 0] [--rule-change | --rule-changes N]

Starts an embedded broker and `rulectl detect` (local[2]), publishes 50 threshold +
10 velocity + 2 correlation rules (the backtest benchmark's set), produces events at
the target rate with `sent_ms` (produce time) in each event and event time = now, and
consumes `events.processed`. Prints the sustained input rate the job kept up with
(events / wall time from first produce until the job's lag is 0 again) and the p50/p99
latency from produce to the detection landing on the sink topic.

`--rare-rules N` publishes N more threshold rules, each asking for one user that about one
event in ten thousand has (`user_id == "r<k>"`, amount > 10): a large rule set whose
rules each match little, so the detections stay about the same as N grows.

`--rule-change` publishes, halfway through the measured run, version 2 of every rule
(the same conditions, so the detections stay the same) and prints the seconds from the
publish (acknowledged by the broker) to the first detection of a version 2 rule on the
sink, to the status naming every version 2 rule, and whether the query ran on (its run
id unchanged: no restart). `--rule-changes N` publishes N versions (2, 3, ...) spread
evenly over the run and prints each one's seconds from its publish to its first
detection, their median and their maximum: one change lands wherever it lands in the
job's polls and batches, N of them show the spread.

`--shadows N` also publishes a shadow (issue 39: `mode: shadow`, version 2, the same
conditions) of N of the rules, of every kind (for 10: 5 threshold, 3 velocity, the 2
correlation rules; the velocity and correlation shadows share the state of the
versions in force): the job then judges
every event with both versions of those rules and writes the shadows' detections to
`events.shadow`. `--compare-shadows N` runs the benchmark twice back to back, without
shadows and with N, and prints (and records) the ratios of rate and latency.

`--warmup S` first produces S seconds of the same load (events marked `warmup`, left out
of every figure) and waits for the job to catch up: the figures are then those of a job
whose JIT has seen the load, not of its first batches (a just-started job, compiled
code not yet hot, is the cold figure, without it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml
from confluent_kafka import Consumer, Producer, TopicPartition

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from bench_backtest import make_rules  # noqa: E402
from detect_harness import DetectJob  # noqa: E402
from record import RESULTS, append_result  # noqa: E402
from stage_times import event_log_conf, keyed_stage_times  # noqa: E402

from spark_jobs.kafka.broker import EmbeddedBroker, free_port  # noqa: E402
from spark_jobs.kafka.publisher import publish_rules  # noqa: E402
from spark_jobs.rules.model import parse_rule  # noqa: E402


def consume_latencies(bootstrap: str, stop: threading.Event, out: list[float],
                      first_seen: dict[str, float] | None = None, by_type: dict[str, list[float]] | None = None) -> None:
    """Latencies (ms) from produce to the sink into `out` (and per rule type into
    `by_type`); the time the first detection of each rule version was read into
    `first_seen` (version -> time)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False})
    c.assign([TopicPartition("events.processed", 0, 0)])
    while not stop.is_set():
        for m in c.consume(1000, 0.2):
            if m.error():
                continue
            now = time.time() * 1000
            ev = json.loads(m.value())
            sent = ev.get("sent_ms")
            if sent and not ev.get("warmup"):
                out.append(now - sent)
                if by_type is not None:
                    by_type.setdefault(ev.get("rule_type", "?"), []).append(now - sent)
            if first_seen is not None and ev.get("rule_version") not in first_seen:
                first_seen[ev.get("rule_version")] = now / 1000
    c.close()


def change_rules(job: DetectJob, bootstrap: str, rules: list, seconds: float, changes: int,
                 first_seen: dict[str, float], out: dict) -> None:
    """`changes` times, evenly spread over `seconds`: the next version of every rule in
    `rules` (2, 3, ...; the same conditions), each timed from its publish (acknowledged
    by the broker) to its first detection on the sink, and the first also to the job's
    status (see the module's doc)."""
    before = job.status()
    start = time.time()
    to_detection: list[float] = []
    for k in range(changes):
        # On a fixed schedule, whatever the earlier changes took: the last one still
        # meets seconds / (changes + 1) of load.
        time.sleep(max(0.0, start + seconds * (k + 1) / (changes + 1) - time.time()))
        version = str(k + 2)
        changed = [r.model_copy(update={"version": version}) for r in rules]
        t0 = time.time()
        publish_rules(changed, bootstrap)
        published = time.time()
        if k == 0:
            ids = {r.rule_id for r in changed}
            job.wait_for(lambda s, ids=ids: all(s["rule_versions"].get(i) == "2" for i in ids), timeout=300)
            out.update(changed_rules=len(changed), publish_s=round(published - t0, 2),
                       publish_to_status_s=round(time.time() - published, 2))
        # The consumer thread stamps each version's first detection as it reads it.
        while version not in first_seen and time.time() - published < seconds / (changes + 1):
            time.sleep(0.05)
        if version in first_seen:
            to_detection.append(round(first_seen[version] - published, 2))
    s = job.status()
    out.update(publish_to_first_v2_detection_s=to_detection[0] if to_detection else None,
               run_id_kept=s["run_id"] == before["run_id"])
    if changes > 1:
        out.update(changes=changes, publish_to_first_detection_s=to_detection,
                   detected_changes=len(to_detection),
                   publish_to_first_detection_median_s=round(statistics.median(to_detection), 2) if to_detection else None,
                   publish_to_first_detection_max_s=max(to_detection, default=None))


RARE_SHARE = 1e-4  # of the events, per rare rule


def rare_rules(n: int) -> list[dict]:
    return [{"rule_id": f"rare_{k}", "version": "1", "rule_type": "threshold", "source_topic": "events.raw",
             "owner": "bench", "conditions": [{"field": "user_id", "operator": "==", "value": f"r{k}"},
                                              {"field": "amount", "operator": ">", "value": 10}]}
            for k in range(n)]


def produce_events(bootstrap: str, rate: int, seconds: int, users: int, warmup: bool = False,
                   rare: int = 0) -> float:
    """`rate` events/s for `seconds` on events.raw (event time and `sent_ms` = now), and a
    context record per pair every 5000 events; returns the seconds it took. `warmup`:
    the events say so (left out of the latencies)."""
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000})
    rnd = random.Random(1)
    types = ["purchase", "click", "view", "transfer"]
    pairs = ["EURUSD", "GBPUSD", "USDJPY", "AUDUSD"]
    total = rate * seconds
    start = time.time()
    for i in range(total):
        if i % 1000 == 0:
            ahead = i / rate - (time.time() - start)
            if ahead > 0:
                time.sleep(ahead)
        now = int(time.time() * 1000)
        user = f"r{rnd.randrange(rare)}" if rare and rnd.random() < rare * RARE_SHARE else f"u{rnd.randrange(users)}"
        ev = {"event_id": i, "type": types[rnd.randrange(4)], "user_id": user,
              "amount": rnd.randrange(1000), "merchant": f"m{rnd.randrange(50)}", "ts": now, "sent_ms": now}
        if warmup:
            ev["warmup"] = True
        if i % 10 == 0:
            ev["currency_pair"] = pairs[rnd.randrange(4)]
            ev["implied_rate"] = round(1 + rnd.random() * 0.1, 4)
        p.produce("events.raw", value=json.dumps(ev, separators=(",", ":")).encode())
        if i % 5000 == 0:
            for pair in pairs:
                p.produce("context.raw", value=json.dumps({"currency_pair": pair, "rate": 1.04, "ts": now}).encode())
        p.poll(0)
    p.flush(60)
    return time.time() - start


def wait_caught_up(job: DetectJob, timeout: float) -> None:
    """Until a batch that started after the last produce has left nothing behind."""
    produced_at = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 1))
    job.wait_for(lambda s: (s.get("last_batch_time") or "") > produced_at and s.get("lag") == 0, timeout=timeout)


def sample_batches(job: DetectJob, stop: threading.Event, out: dict[int, dict]) -> None:
    """Each micro-batch's size and time breakdown, from the job's status file."""
    while not stop.is_set():
        try:
            s = job.status()
        except Exception:  # the file is replaced atomically; a read may still race a start
            s = {}
        if s.get("last_batch_id") is not None and s.get("batch_duration_ms"):
            out[s["last_batch_id"]] = {"rows": s.get("num_input_rows") or 0, **s["batch_duration_ms"]}
        stop.wait(0.2)


def print_rate_and_latency(total: int, done_s: float, lat: list[float], what: str) -> dict:
    """Sustained events/s and the p50/p99 of `lat` (ms from produce to `what` on the sink);
    returns them as figures."""
    out = {"events_per_s": round(total / done_s), f"{what}s": len(lat)}
    print(f"sustained: {total / done_s:,.0f} events/s")
    if lat:
        lat = sorted(lat)
        p50 = statistics.median(lat)
        p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))]
        out.update(latency_p50_s=round(p50 / 1000, 2), latency_p99_s=round(p99 / 1000, 2))
        print(f"{what}s: {len(lat)}; latency produce->{what} p50 {p50 / 1000:.2f}s p99 {p99 / 1000:.2f}s")
    return out


def print_batches(batches: dict[int, dict]) -> dict:
    busy = [b for b in batches.values() if b["rows"] > 0]
    if not busy:
        return {}
    med = {k: statistics.median(b.get(k, 0) for b in busy) for k in busy[0] if k != "rows"}
    rows = statistics.median(b["rows"] for b in busy)
    print(f"batches with input: {len(busy)} (of {len(batches)} seen); median rows {rows:,.0f}")
    print("median ms per batch: " + ", ".join(f"{k} {v:,.0f}" for k, v in sorted(med.items(), key=lambda kv: -kv[1])))
    return {"batches_with_input": len(busy), "median_batch_rows": rows,
            "median_batch_ms": {k: round(v) for k, v in med.items()}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=int, default=20_000)
    ap.add_argument("--seconds", type=int, default=60)
    ap.add_argument("--users", type=int, default=2_000)
    ap.add_argument("--trigger-ms", type=int, default=500)
    ap.add_argument("--warmup", type=int, default=0, help="seconds of the same load first, left out of the figures")
    ap.add_argument("--timeout", type=int, default=1800, help="give up waiting for the job after this many seconds")
    ap.add_argument("--rare-rules", type=int, default=0, help="more threshold rules, each matching ~1 event in 10k")
    ap.add_argument("--rule-change", action="store_true", help="publish version 2 of every rule halfway")
    ap.add_argument("--rule-changes", type=int, default=0, metavar="N",
                    help="publish N new versions of every rule, spread over the run, each timed to the sink")
    ap.add_argument("--threshold-lane", choices=["micro-batch", "real-time"], default="micro-batch",
                    help="rulectl detect --threshold-lane")
    ap.add_argument("--window-scale", type=float, default=1.0,
                    help="scale the velocity rules' windows (30-120 s) by this factor: what window size costs")
    ap.add_argument("--event-log", action="store_true",
                    help="write Spark's event log and print where the keyed query's batches spend their time")
    ap.add_argument("--shadows", type=int, default=0, help="publish a shadow version of N of the rules")
    ap.add_argument("--compare-shadows", type=int, default=0, metavar="N",
                    help="run without shadows, then with N, and record the ratios")
    args = ap.parse_args()
    if args.compare_shadows:
        compare_shadows(args.compare_shadows)
        return
    work = Path(tempfile.mkdtemp(prefix="bench-detect-"))
    if args.event_log:
        # The job is its own process: it reads spark-defaults.conf from $SPARK_CONF_DIR.
        (work / "spark-conf").mkdir()
        (work / "event-log").mkdir()
        (work / "spark-conf" / "spark-defaults.conf").write_text(event_log_conf(work / "event-log"))
        os.environ["SPARK_CONF_DIR"] = str(work / "spark-conf")
    with EmbeddedBroker(port=free_port()) as broker:
        rules_dir = work / "rules"
        rules_dir.mkdir()
        make_rules(rules_dir, window_scale=args.window_scale)
        rules = [parse_rule(r) for r in [*yaml.safe_load((rules_dir / "bench.yaml").read_text()),
                                         *rare_rules(args.rare_rules)]]
        publish_rules(rules, broker.bootstrap)
        shadow_kinds = None
        if args.shadows:
            shadows = shadows_of(rules, args.shadows)
            publish_rules(shadows, broker.bootstrap)
            shadow_kinds = ", ".join(f"{sum(r.rule_type == k for r in shadows)} {k}"
                                     for k in ("threshold", "velocity", "correlation"))
        job = DetectJob(broker.bootstrap, work / "job", trigger_ms=args.trigger_ms,
                        extra_args=("--threshold-lane", args.threshold_lane))
        job.start(timeout=300)
        lat: list[float] = []
        first_seen: dict[str, float] = {}
        by_type: dict[str, list[float]] = {}
        stop = threading.Event()
        t = threading.Thread(target=consume_latencies, args=(broker.bootstrap, stop, lat, first_seen, by_type),
                             daemon=True)
        t.start()
        if args.warmup:
            produce_events(broker.bootstrap, args.rate, args.warmup, args.users, warmup=True, rare=args.rare_rules)
            wait_caught_up(job, args.timeout)
        batches: dict[int, dict] = {}
        sampler = threading.Thread(target=sample_batches, args=(job, stop, batches), daemon=True)
        sampler.start()
        total = args.rate * args.seconds
        measured_from_ms = int(time.time() * 1000)
        change: dict = {}
        changes = args.rule_changes or int(args.rule_change)
        changer = threading.Thread(target=change_rules, args=(job, broker.bootstrap, rules, args.seconds, changes,
                                                               first_seen, change), daemon=True)
        if changes:
            changer.start()
        start = time.time()
        produced_s = produce_events(broker.bootstrap, args.rate, args.seconds, args.users, rare=args.rare_rules)
        wait_caught_up(job, args.timeout)
        done_s = time.time() - start
        if changes:
            changer.join(300)
        time.sleep(3)
        stop.set()
        t.join(5)
        job.stop()
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}, Spark local[2], "
          f"trigger {args.trigger_ms} ms, {args.users} users, warm-up {args.warmup} s")
    print(f"produced {total} events in {produced_s:.1f}s (target {args.rate}/s); job caught up after {done_s:.1f}s")
    figures = print_rate_and_latency(total, done_s, lat, "detection")
    for rule_type in ("threshold", "velocity"):
        if by_type.get(rule_type):
            typed = sorted(by_type[rule_type])
            p50, p99 = statistics.median(typed), typed[min(len(typed) - 1, int(len(typed) * 0.99))]
            print(f"{rule_type} detections: {len(typed)}; p50 {p50 / 1000:.2f}s p99 {p99 / 1000:.2f}s")
            figures.update({f"{rule_type}_p50_s": round(p50 / 1000, 2), f"{rule_type}_p99_s": round(p99 / 1000, 2)})
    figures.update(print_batches(batches), produced_s=round(produced_s, 1), caught_up_s=round(done_s, 1))
    if args.event_log:
        stages = keyed_stage_times(work / "event-log", measured_from_ms)
        for name, f in stages.items():
            print(f"keyed query, {name}: " + ", ".join(f"{k} {v:,}" for k, v in f.items()))
        figures["keyed_stages"] = stages
    if change:
        print("rule change: " + ", ".join(f"{k} {v}" for k, v in change.items()))
        figures.update({f"rule_change_{k}": v for k, v in change.items()})
    append_result("detect", figures, rate=args.rate, seconds=args.seconds, users=args.users,
                  trigger_ms=args.trigger_ms, warmup_s=args.warmup, rules=len(rules), threshold_lane=args.threshold_lane,
                  window_scale=args.window_scale if args.window_scale != 1.0 else None, shadows=args.shadows or None,
                  shadow_kinds=shadow_kinds)


def shadows_of(rules: list, n: int) -> list:
    """Shadows (version 2, the same conditions) of n rules of every kind: a fifth
    correlation (as many as there are), the rest of a half velocity, the others threshold."""
    corr = [r for r in rules if r.rule_type == "correlation"][: n // 5]
    vel = [r for r in rules if r.rule_type == "velocity"][: n // 2 - len(corr)]
    picked = [r for r in rules if r.rule_type == "threshold"][: n - len(corr) - len(vel)] + vel + corr
    return [r.model_copy(update={"version": "2", "mode": "shadow"}) for r in picked]


def _batch_ratio(base: dict, other: dict) -> float | None:
    """Ratio of the keyed query's median batch time (the `total` of median_batch_ms)."""
    a, b = (r.get("median_batch_ms") or {} for r in (base, other))
    key = next((k for k in ("total", "triggerExecution", "batch") if k in a and k in b), None)
    return round(b[key] / a[key], 2) if key and a[key] else None


def compare_shadows(n: int) -> None:
    """This benchmark without shadows, then with `n`, one after the other; the ratios of
    the second run's figures to the first's, recorded as their own row."""
    import subprocess

    argv = [a for a in sys.argv[1:] if not a.startswith("--compare-shadows")]
    if "--compare-shadows" in sys.argv:
        i = sys.argv.index("--compare-shadows")
        argv = sys.argv[1:i] + sys.argv[i + 2:]
    rows = []
    for shadows in (0, n):
        subprocess.run([sys.executable, __file__, *argv, *(["--shadows", str(shadows)] if shadows else [])], check=True)
        rows.append(json.loads(RESULTS.read_text().splitlines()[-1]))
    base, with_shadows = rows
    ratios = {f"{k}_ratio": round(with_shadows[k] / base[k], 2)
              for k in ("events_per_s", "latency_p50_s", "latency_p99_s", "threshold_p99_s", "velocity_p99_s")
              if isinstance(base.get(k), int | float) and base[k] and isinstance(with_shadows.get(k), int | float)}
    ratios["batch_ms_ratio"] = _batch_ratio(base, with_shadows)
    print(f"with {n} shadows / without: " + ", ".join(f"{k} {v}" for k, v in ratios.items()))
    append_result("detect_shadows", ratios, shadows=n, shadow_kinds=with_shadows.get("shadow_kinds"),
                  rate=base.get("rate"), seconds=base.get("seconds"),
                  warmup_s=base.get("warmup_s"), threshold_lane=base.get("threshold_lane"))


if __name__ == "__main__":
    main()
