"""A backtest over many small topics: how its time grows with the number of topics.

    python tests/benchmarks/bench_backtest_topics.py [--sets 1 6 24] [--events-per-topic 40]

Each rule set is the demo's rules (rules/*.yaml: threshold, velocity with and without
routing, correlation) on topics of its own, `sN.events.raw` and `sN.context.raw`, with
`--events-per-topic` demo records on each. 24 sets are 48 topics. Every run is a cold
`rulectl backtest` in a fresh process (Python imports, Spark start-up and the run), as
a user or a scheduled backtest starts it; `backtest_s` is the run alone (the summary's
`duration_s`). Under load (other jobs on the machine) the figures are upper bounds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import append_result  # noqa: E402

DEMO = ROOT / "tests" / "data" / "demo"


def write_sets(work: Path, sets: int, per_topic: int) -> tuple[Path, list[str], int]:
    """The rules folder, the `--input` arguments and the number of rules of `sets` copies
    of the demo's rules, each copy on its own two topics."""
    rules_dir = work / "rules"
    rules_dir.mkdir(parents=True)
    demo_rules: list[dict] = []
    for p in sorted((ROOT / "rules").glob("*.yaml")):
        doc = yaml.safe_load(p.read_text())  # a rule, or a list of rules
        demo_rules += doc if isinstance(doc, list) else [doc]
    records = {t: (DEMO / f"{t}.jsonl").read_text().splitlines() for t in ("events.raw", "context.raw")}
    inputs: list[str] = []
    n_rules = 0
    for s in range(sets):
        renamed = []
        for rule in demo_rules:
            r = json.loads(json.dumps(rule).replace('"events.raw"', f'"s{s}.events.raw"')
                           .replace('"context.raw"', f'"s{s}.context.raw"'))
            r["rule_id"] = f"s{s}_{r['rule_id']}"
            if r.get("velocity_filter_rule_id"):
                r["velocity_filter_rule_id"] = f"s{s}_{r['velocity_filter_rule_id']}"
            renamed.append(r)
        (rules_dir / f"set{s}.yaml").write_text(yaml.safe_dump(renamed))
        n_rules += len(renamed)
        for topic, lines in records.items():
            path = work / "inputs" / f"s{s}.{topic}.jsonl"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join(lines[i % len(lines)] for i in range(per_topic)) + "\n")
            inputs += ["--input", f"s{s}.{topic}={path}"]
    return rules_dir, inputs, n_rules


def run(sets: int, per_topic: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-topics-") as d:
        work = Path(d)
        rules_dir, inputs, n_rules = write_sets(work, sets, per_topic)
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "spark_jobs.cli", "backtest", "--rules", str(rules_dir), *inputs,
                               "--out", str(work / "out")], capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            sys.exit(done.stderr[-3000:])
        summary = json.loads((work / "out" / "summary.json").read_text())
    return {"sets": sets, "topics": 2 * sets, "rules": n_rules, "events": 2 * sets * per_topic,
            "detections": summary["detections"], "backtest_s": summary["duration_s"], "process_wall_s": round(wall, 2)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sets", type=int, nargs="+", default=[1, 6, 24])
    p.add_argument("--events-per-topic", type=int, default=40)
    args = p.parse_args()
    for sets in args.sets:
        figures = run(sets, args.events_per_topic)
        print(json.dumps(figures))
        append_result("backtest_topics", figures)


if __name__ == "__main__":
    main()
