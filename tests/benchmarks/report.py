"""Writes the results section of docs/benchmarks.md from tests/benchmarks/results.jsonl.

    .venv/bin/python tests/benchmarks/report.py          # rewrite the section
    .venv/bin/python tests/benchmarks/report.py --check  # exit 1 if it is out of date

For each benchmark: what it measures, the command, and a table of its rows in
results.jsonl (record.py appends them), oldest first. Only the text between BEGIN and
END is written; tests/unit/test_benchmarks_doc.py fails when it differs from what this
script writes.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS = HERE / "results.jsonl"
DOC = ROOT / "docs" / "benchmarks.md"
BEGIN = "<!-- BEGIN results: written by tests/benchmarks/report.py from tests/benchmarks/results.jsonl; do not edit -->"
END = "<!-- END results -->"
PY = "PYTHONPATH=. .venv/bin/python tests/benchmarks/"


@dataclass(frozen=True)
class Bench:
    script: str
    what: str
    command: str
    context: list[tuple[str, str]] = field(default_factory=list)  # (key, column title): the run's settings
    figures: list[tuple[str, str]] = field(default_factory=list)  # (key, column title)


BENCHES = {
    "backtest": Bench(
        "bench_backtest.py",
        "Backtest throughput of generated events under 50 threshold, 10 velocity and 2 correlation rules on "
        "`local[2]`, cold (the first run of a session); `--rule-copies N` adds N copies of the threshold and "
        "velocity rules that each also ask for one user (~1 event in 20,000); `--loop` then runs the same rules "
        "over the same files in one plain Python process (python_loop.py) and gives the backtest's speed-up "
        "over it, with its detections held equal per rule; `--table` reads a Delta table shaped like the event "
        "archive, `--repeat N` runs warm repeats in one session, `--only RULE_ID` times some rules, `--conf` "
        "sets Spark settings.",
        f"{PY}bench_backtest.py --events 1000000 --loop",
        [("events", "events"), ("rules", "rules"), ("source", "from"), ("run", "run"), ("conf", "conf")],
        [("events_per_s", "events/s"), ("elapsed_s", "s"), ("jvm_cpu_s", "JVM CPU s"), ("jit_s", "of it JIT s"),
         ("driver_cpu_s", "driver CPU s"), ("detections", "detections"), ("loop_s", "Python loop s"),
         ("loop_ratio", "x the loop"), ("loop_equal", "same detections")]),
    "backtest_floor": Bench(
        "bench_backtest_floor.py",
        "The floor under the backtest: the same run written by hand as the cheapest Spark plan for exactly "
        "these rules and data (no engine); `--parts` times each rule kind.",
        f"{PY}bench_backtest_floor.py --events 1000000 --table",
        [("events", "events"), ("source", "from")],
        [("events_per_s", "at most events/s"), ("floor_s", "floor s"), ("parse_s", "parse s"),
         ("rules_s", "rules and output s")]),
    "backtest_fixed_cost": Bench(
        "bench_backtest_fixed_cost.py",
        "A backtest's fixed cost on a small input: Python imports, Spark start-up, the first and warm "
        "backtests, and the same from the archive table.",
        f"{PY}bench_backtest_fixed_cost.py --events 1000",
        [("events", "events")],
        [("imports_s", "imports s"), ("spark_startup_s", "Spark start-up s"), ("backtest_cold_s", "first backtest s"),
         ("backtest_warm_s", "warm backtests s"), ("archive_backtest_s", "from the archive s"),
         ("total_cold_s", "cold total s")]),
    "backtest_topics": Bench(
        "bench_backtest_topics.py",
        "A cold `rulectl backtest` over many small topics: N copies of the demo's rules, each on two topics "
        "of its own with 40 demo records a topic; how the run grows with the number of topics.",
        f"{PY}bench_backtest_topics.py --sets 1 6 24",
        [("sets", "rule sets"), ("topics", "topics"), ("rules", "rules"), ("events", "events")],
        [("backtest_s", "backtest s"), ("process_wall_s", "process s"), ("detections", "detections")]),
    "detect": Bench(
        "bench_detect.py",
        "Live throughput and latency: an embedded broker and `rulectl detect`, events produced at a target "
        "rate; the sustained rate and p50/p99 produce-to-detection latency; `--warmup S` leaves a first load out; "
        "`--rare-rules N` adds N threshold rules that each match about one event in ten thousand; "
        "`--rule-change` publishes version 2 of every rule halfway and times it to the sink; `--rule-changes N` "
        "publishes N versions spread over the run (median and maximum of their times); "
        "`--threshold-lane real-time` runs the threshold rules in the real-time lane; `--window-scale F` scales "
        "the velocity windows; `--event-log` writes "
        "Spark's event log and reads the keyed query's CPU per batch, stage by stage, from it (stage_times.py).",
        f"{PY}bench_detect.py --rate 20000 --seconds 30 --users 2000 --warmup 20",
        [("rate", "target events/s"), ("seconds", "s"), ("warmup_s", "warm-up s"), ("rules", "rules"),
         ("threshold_lane", "threshold lane"), ("window_scale", "window scale"), ("shadows", "shadows")],
        [("events_per_s", "sustained events/s"), ("latency_p50_s", "p50 s"), ("latency_p99_s", "p99 s"),
         ("threshold_p50_s", "threshold p50 s"), ("threshold_p99_s", "threshold p99 s"),
         ("velocity_p99_s", "velocity p99 s"),
         ("rule_change_changed_rules", "rules changed"),
         ("rule_change_publish_to_first_v2_detection_s", "publish → first new-version detection s"),
         ("rule_change_query_restarts", "query restarts for it"),
         ("rule_change_changes", "rule changes"),
         ("rule_change_publish_to_first_detection_median_s", "publish → first detection, median s"),
         ("rule_change_publish_to_first_detection_max_s", "publish → first detection, max s"),
         ("keyed_stages.scan.cpu_ms_mean", "keyed batch CPU ms: scan"),
         ("keyed_stages.first operator.cpu_ms_mean", "first operator"),
         ("keyed_stages.second operator.cpu_ms_mean", "second operator")]),
    "detect_shadows": Bench(
        "bench_detect.py",
        "What shadow versions cost the live job: `bench_detect.py --compare-shadows N` runs the live benchmark "
        "twice, one run after the other, without shadows and then with a shadow (mode shadow, version 2, the "
        "same conditions) of N of its rules (`shadow kinds`: how many of each kind; rows without it had half "
        "threshold and half velocity), velocity and correlation shadows sharing the state of the versions in "
        "force; each figure is the run with shadows over the run without (rate: higher is better; latency and batch time: lower is better).",
        f"{PY}bench_detect.py --rate 5000 --seconds 30 --warmup 20 --compare-shadows 10",
        [("shadows", "shadows"), ("shadow_kinds", "shadow kinds"), ("rate", "target events/s"), ("seconds", "s"), ("threshold_lane", "threshold lane")],
        [("events_per_s_ratio", "sustained rate ratio"), ("latency_p50_s_ratio", "p50 ratio"),
         ("latency_p99_s_ratio", "p99 ratio"), ("threshold_p99_s_ratio", "threshold p99 ratio"),
         ("velocity_p99_s_ratio", "velocity p99 ratio"), ("batch_ms_ratio", "keyed batch time ratio")]),
    "backlog": Bench(
        "bench_backlog.py",
        "Backlog drain: the live job draining a backlog (threshold and event-time velocity rules; "
        "`--rule-copies N` adds copies that each ask for one user), against the same rules over the same file "
        "in one plain Python process (python_loop.py), whose detections per rule it must equal; `--warmup N` "
        "first drains N warm-up events (a job that has been running, not one just started); `--floor` then "
        "drains the same backlog, after the same warm-up, with the floor of Spark's own operators "
        "(bench_live_floor.py --jvm-rules --backlog).",
        f"{PY}bench_backlog.py --events 300000 --warmup 100000 --floor",
        [("events", "events"), ("rules", "rules"), ("max_offsets", "max offsets per trigger"),
         ("threshold_lane", "threshold lane"), ("warmup", "warm-up events")],
        [("events_per_s", "events/s"), ("drain_s", "drain s"), ("detections", "detections"),
         ("detections_equal_reference", "equal to the reference"), ("loop_s", "Python loop s"),
         ("loop_ratio", "x the loop"), ("detections_equal_loop", "equal to the loop"), ("floor_s", "floor s"),
         ("floor_ratio", "x the floor's time"), ("floor_loop_ratio", "floor x the loop")]),
    "first_detection": Bench(
        "bench_first_detection.py",
        "Seconds from `rulectl detect` starting to its first detection on the sink, with `rules/` and the demo "
        "events on a real broker.",
        f"{PY}bench_first_detection.py --runs 2",
        [("run", "run")],
        [("first_batch_s", "first micro-batch s"), ("first_detection_s", "first detection s")]),
    "live_floor": Bench(
        "bench_live_floor.py",
        "The floor under the live job: Spark's Kafka source, parse and sink with no rules; `--stateful` adds a "
        "do-nothing Python stateful operator, `--jvm-rules` the rules' work in Spark's own operators; "
        "`--backlog N` drains instead of a live rate; `--real-time DURATION` uses real-time mode.",
        f"{PY}bench_live_floor.py --jvm-rules --rate 20000 --seconds 30",
        [("variant", "variant"), ("trigger", "trigger"), ("rate", "target events/s"), ("backlog", "backlog"),
         ("warmup", "warm-up events")],
        [("events_per_s", "events/s"), ("latency_p50_s", "p50 s"), ("latency_p99_s", "p99 s")]),
    "live_plan": Bench(
        "bench_live_plan.py",
        "The JVM CPU per event of each part of the live plan (read, parse, the first operator's input), as "
        "batch queries to the noop sink: the figure to compare between runs on a loaded machine.",
        f"{PY}bench_live_plan.py --events 300000",
        [("events", "events"), ("threshold_lane", "threshold lane"), ("max_fields", "codegen maxFields")],
        [("read_us_per_event", "read µs/event"), ("classify_us_per_event", "+ parse µs/event"),
         ("event_rows_us_per_event", "+ operator input µs/event"), ("operator_rows_per_event", "operator rows/event")]),
    "cluster": Bench(
        "bench_cluster.py",
        "The live job draining a backlog on the one-machine cluster (three brokers, a standalone master, "
        "1 or 2 workers, client mode).",
        f"{PY}bench_cluster.py --events 120000 --workers 1 2",
        [("events", "events"), ("workers", "workers")],
        [("events_per_s", "events/s")]),
    "release": Bench(
        "bench_release.py",
        "Seconds from a rule commit to its approval request on a running platform, per task of `rule_release` "
        "(each row's `tasks` in results.jsonl). On a platform started with `rulectl up --workdir /tmp/bench/var "
        "--port 19092 --airflow-port 18080` whose demo has filled the archive for a few minutes "
        "(`--start --fill-minutes 5` starts and stops one itself).",
        ".venv/bin/python tests/benchmarks/bench_release.py --workdir /tmp/bench/var --airflow-port 18080",
        [("label", "what")],
        [("commit_to_detection_s", "commit → sensor s"), ("commit_to_approval_s", "commit → approval request s")]),
    "suite_cpu": Bench(
        "bench_suite_cpu.py",
        "Where a test run's CPU goes: `make test` (or another command) with every process on the machine "
        "sampled every 2 s, CPU seconds summed by component (Spark JVMs by who started them, brokers, "
        "Airflow, pytest); busy is CPU seconds over wall seconds times cores.",
        ".venv/bin/python tests/benchmarks/bench_suite_cpu.py",
        [("tested", "command"), ("env", "environment")],
        [("exit_code", "exit"), ("wall_s", "wall s"), ("cpu_s", "CPU s"), ("busy", "busy"),
         ("largest", "largest parts, CPU s")]),
    "idle_job": Bench(
        "bench_idle_job.py",
        "A detection job at the demo's trickle of events, its checkpoint written through Hadoop's FileSystem API "
        "over the platform's local file system (the job's setting), over Hadoop's own (`chmod`: a process per file "
        "it creates; rows before it existed have no figure) and through Spark's default FileContext manager, which "
        "starts a `chmod` or `readlink` process for most checkpoint files it writes: the machine's busy cores, "
        "processes started per second, the job JVM's cores, the last batch's duration and WAL commit, and (later "
        "rows) the classes the JVM loaded per second (Spark's generated code compiled again) and the keyed "
        "query's micro-batches per second.",
        f"{PY}bench_idle_job.py",
        [("rate", "events/s"), ("seconds", "seconds"), ("threshold_lane", "threshold lane")],
        [("filesystem_busy_cores", "busy cores"), ("chmod_busy_cores", "chmod"),
         ("filecontext_busy_cores", "FileContext"),
         ("filesystem_processes_per_s", "processes/s"), ("chmod_processes_per_s", "chmod"),
         ("filecontext_processes_per_s", "FileContext"),
         ("filesystem_job_jvm_cores", "job JVM cores"), ("chmod_job_jvm_cores", "chmod"),
         ("filecontext_job_jvm_cores", "FileContext"),
         ("filesystem_jit_cores", "of it: JIT compiler threads"), ("filesystem_tasks_cores", "tasks"),
         ("filesystem_query_driver_cores", "query threads"),
         ("filesystem_classes_loaded_per_s", "classes loaded/s"), ("filesystem_keyed_batches_per_s", "keyed batches/s"),
         ("filesystem_batch_ms", "batch ms"), ("chmod_batch_ms", "chmod"), ("filecontext_batch_ms", "FileContext"),
         ("filesystem_wal_commit_ms", "WAL commit ms"), ("chmod_wal_commit_ms", "chmod"),
         ("filecontext_wal_commit_ms", "FileContext")]),
    "idle_platform": Bench(
        "bench_idle_platform.py",
        "`rulectl up` (broker, Airflow, detection job, event archive, Spark Connect server, demo at its default "
        "rate) in a fresh work folder, left running: after the warm-up, the cores each part keeps busy; "
        "`--archive-trigger-ms` sets the archive's trigger (empty: its default).",
        ".venv/bin/python tests/benchmarks/bench_idle_platform.py",
        [("seconds", "seconds"), ("warmup", "warm-up s"), ("archive_trigger_ms", "archive trigger ms")],
        [("total_cores", "busy cores"), ("detection_job_cores", "detection job"),
         ("archive_job_cores", "archive job")]),
    "lane_idle": Bench(
        "bench_lane_idle.py",
        "An idle detection job (a threshold rule on each of N one-partition topics, no events) with its threshold "
        "rules in the micro-batch query and in the real-time lane, which keeps a task per source partition running: "
        "the job JVM's cores, and the broker's over the same window (later rows); `--lanes real-time` measures "
        "the lane only.",
        f"{PY}bench_lane_idle.py --topics 2 130",
        [("partitions", "source partitions"), ("seconds", "seconds"),
         ("jfr", "real-time lane under JDK Flight Recorder"), ("lane_fetch_wait_ms", "lane's fetch wait ms"),
         ("lane_batch_ms", "lane's batch ms")],
        [("micro_batch_job_jvm_cores", "micro-batch: job JVM cores"), ("micro_batch_broker_cores", "broker cores"),
         ("real_time_job_jvm_cores", "real-time lane: job JVM cores"), ("real_time_broker_cores", "broker cores")]),
    "job_start": Bench(
        "bench_job_start.py",
        "A detection job's start on a broker with the repository's rules: seconds to its first completed "
        "micro-batch, its JVM's CPU seconds by then (of it HotSpot's compiler threads, the tasks, the queries' "
        "threads), its Python driver's, and the JVM's cores idle after it; with the class archive and without, "
        "alternately, medians.",
        f"{PY}bench_job_start.py --runs 2 --suite-jit",
        [("runs", "runs"), ("jit", "JIT")],
        [("archive_first_batch_s", "first batch s"), ("none_first_batch_s", "without archive"),
         ("archive_jvm_cpu_s", "JVM CPU s"), ("none_jvm_cpu_s", "without archive"),
         ("archive_jit_cpu_s", "of it JIT"), ("archive_tasks_cpu_s", "tasks"),
         ("archive_query_driver_cpu_s", "queries"), ("archive_python_cpu_s", "driver's Python CPU s"),
         ("archive_idle_cores", "idle cores after")]),
    "jvm_start": Bench(
        "bench_jvm_start.py",
        "A platform JVM's start with and without its class-data sharing archive (spark_jobs/jvm/class_archive.py, "
        "written by set-up): a Spark session up to its first small query, the same for a streaming job's session "
        "(the detection and archive jobs': the platform's jar on its class path), a Kafka broker up to serving; "
        "medians of alternating runs, wall seconds and the JVM's own CPU seconds.",
        f"{PY}bench_jvm_start.py",
        [("runs", "runs")],
        [("spark_archive_wall_s", "Spark wall s"), ("spark_none_wall_s", "without"),
         ("spark_archive_cpu_s", "Spark CPU s"), ("spark_none_cpu_s", "without"),
         ("streaming_archive_cpu_s", "streaming job CPU s"), ("streaming_none_cpu_s", "without"),
         ("broker_archive_wall_s", "broker wall s"), ("broker_none_wall_s", "without"),
         ("broker_archive_cpu_s", "broker CPU s"), ("broker_none_cpu_s", "without")]),
    "real_time_mode": Bench(
        "bench_real_time_mode.py",
        "Which of the live job's operator kinds Spark's real-time mode accepts on the pinned Spark, and when "
        "a stateful query's first result arrives with the allowlist check off.",
        f"{PY}bench_real_time_mode.py --batch-duration \"20 seconds\"",
        [("spark_version", "Spark"), ("batch_duration", "batch duration")],
        [("stateless_accepted", "stateless accepted"), ("stateful_accepted", "live plan accepted"),
         ("bypass_first_result_s", "allowlist off: first result s")]),
    "lanes": Bench(
        "bench_lanes.py",
        "Each live lane against its floor in one run on one broker: Spark's minimal real-time query "
        "(Kafka -> parse -> Kafka) under the threshold lane, Kafka -> parse -> groupBy(key).count() -> Kafka in "
        "micro-batches under the velocity rules, both floors at once in one application (the two-query "
        "design's floor), and `rulectl detect --threshold-lane real-time` with 62, 300 and 1,000 rules in force; "
        "p99 as a ratio to the floor's alone and run together, and the keyed query's median batch.",
        f"{PY}bench_lanes.py --rate 5000 --seconds 30 --rules 62,300,1000",
        [("rate", "events/s"), ("rules", "rules"), ("lane_fetch_wait_ms", "lane's fetch wait ms")],
        [("stateless_floor_p99_s", "stateless floor p99 s"), ("threshold_p50_s", "threshold p50 s"),
         ("threshold_p99_s", "threshold p99 s"), ("threshold_p99_over_floor", "threshold p99 / floor"),
         ("keyed_floor_p99_s", "keyed floor p99 s"), ("velocity_p50_s", "velocity p50 s"),
         ("velocity_p99_s", "velocity p99 s"), ("velocity_p99_over_floor", "velocity p99 / floor"),
         ("stateless_together_p99_s", "floors together: stateless p99 s"),
         ("keyed_together_p99_s", "keyed p99 s"), ("threshold_p99_over_together", "threshold p99 / it"),
         ("velocity_p99_over_together", "velocity p99 / it"), ("median_batch_ms.triggerExecution", "keyed batch ms (median)")]),
}


def read_rows(results: Path = RESULTS) -> list[dict]:
    if not results.is_file():
        return []
    return [json.loads(line) for line in results.read_text(encoding="utf-8").splitlines() if line.strip()]


def _get(row: dict, key: str) -> object:
    """row[key], where "a.b" reads row["a"]["b"] (a figure recorded as a mapping)."""
    value: object = row
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _cell(value: object) -> str:
    if value is None or value == "":
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}" if abs(value) < 1e6 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}" if abs(value) >= 10_000 else str(value)
    if isinstance(value, list):
        return ", ".join(_cell(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={_cell(v)}" for k, v in value.items())
    return str(value).replace("|", "\\|").replace("\n", " ")


def _load(row: dict) -> str:
    value = row.get("load_avg")
    if isinstance(value, list) and value:
        return _cell(value[0])  # the 1-minute average
    return _cell(value)


def _commit(row: dict) -> str:
    commit = row.get("project_commit")
    if not commit:
        return "–"
    return commit[:7] + (" + changes" if row.get("dirty") else "")


def table(bench: Bench, rows: list[dict]) -> str:
    head = ["date (UTC)", "commit", "cores, CPU", "load (1-min average, or as noted)"] + [t for _, t in bench.context + bench.figures]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in sorted(rows, key=lambda r: r.get("date") or ""):
        cells = [(row.get("date") or "–")[:16].replace("T", " "), _commit(row),
                 f"{row.get('cores', '–')}, {row.get('cpu_model', '–')}", _load(row)]
        cells += [_cell(_get(row, k)) for k, _ in bench.context + bench.figures]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def section(rows: list[dict]) -> str:
    by_bench: dict[str, list[dict]] = {}
    for row in rows:
        by_bench.setdefault(row.get("bench", "?"), []).append(row)
    parts = [BEGIN, ""]
    for name, bench in BENCHES.items():
        parts += [f"### `{bench.script}`", "", bench.what, "", "```", bench.command, "```", ""]
        mine = by_bench.pop(name, [])
        parts += [table(bench, mine) if mine else f"No results yet; run `{bench.command}`.", ""]
    for name, other in sorted(by_bench.items()):  # rows of a benchmark this script does not know
        parts += [f"### `{name}` (not described in tests/benchmarks/report.py)", "",
                  table(Bench("?", "", ""), other), ""]
    parts.append(END)
    return "\n".join(parts)


def render(doc: str, rows: list[dict]) -> str:
    """`doc` with its section between BEGIN and END written from `rows`."""
    start, end = doc.find(BEGIN), doc.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{DOC} has no section between {BEGIN!r} and {END!r}")
    return doc[:start] + section(rows) + doc[end + len(END):]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/benchmarks.md is out of date")
    args = ap.parse_args()
    doc = DOC.read_text(encoding="utf-8")
    new = render(doc, read_rows())
    if args.check:
        if new != doc:
            print(f"{DOC} is out of date: run .venv/bin/python tests/benchmarks/report.py", file=sys.stderr)
            return 1
        return 0
    if new != doc:
        DOC.write_text(new, encoding="utf-8")
        print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
