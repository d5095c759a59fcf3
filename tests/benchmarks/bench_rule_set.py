"""Threshold rules judged by the JVM rule-set evaluator (one call per event, rules as
data) and by the engine's Spark expressions (every rule compiled into the plan), as
the number of rules grows: the benchmark's 50 threshold rules, plus rules that each
ask for one user (`user_id == "rare_<k>"`, a user no event has: about what a large rule
set's typical rule matches), on the same cached events, in one session.

    .venv/bin/python tests/benchmarks/bench_rule_set.py [--events 200000] [--rules 50 300 1000]

Per rule count and path: the wall time to plan and run a count of (event, rule)
matches (median of 3 runs after a warm-up), and whether both counts agree.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_backtest import EVENT_TYPES, threshold_rule  # noqa: E402
from record import append_result  # noqa: E402


def rules(n: int) -> list[dict]:
    out = []
    for i in range(min(n, 50)):
        event_type, min_amount = threshold_rule(i)
        out.append({"rule_id": f"th_{i:02d}", "version": "1", "rule_type": "threshold", "source_topic": "events.raw",
                    "conditions": [{"field": "type", "operator": "==", "value": event_type},
                                   {"field": "amount", "operator": ">=", "value": min_amount}]})
    for k in range(max(0, n - 50)):
        out.append({"rule_id": f"rare_{k}", "version": "1", "rule_type": "threshold", "source_topic": "events.raw",
                    "conditions": [{"field": "user_id", "operator": "==", "value": f"rare_{k}"},
                                   {"field": "amount", "operator": ">", "value": 10}]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--rules", type=int, nargs="+", default=[50, 300, 1000])
    args = ap.parse_args()
    from pyspark.sql import functions as F

    from spark_jobs.engine.conditions import all_conditions
    from spark_jobs.engine.emits import explode_matching, matching
    from spark_jobs.engine.events import RAW_COLUMNS, parse_events
    from spark_jobs.engine.rule_set import rule_set_spec, threshold_rows, thresholds
    from spark_jobs.engine.values import extract_fields as fields_of
    from spark_jobs.rules.model import parse_rule
    from spark_jobs.spark import session

    spark = session("bench-rule-set")
    rnd = random.Random(7)
    raws = [json.dumps({"type": EVENT_TYPES[rnd.randrange(4)], "user_id": f"u{rnd.randrange(20000)}",
                        "amount": rnd.randrange(1000)}) for _ in range(args.events)]
    raw_df = spark.createDataFrame([("events.raw", i, r, None) for i, r in enumerate(raws)],
                                   "topic string, seq long, raw string, proc_ms long").select(*RAW_COLUMNS)
    parsed, _ = parse_events(raw_df)
    parsed = parsed.cache()
    parsed.count()

    def timed(run) -> tuple[float, int]:
        run()
        walls, n = [], 0
        for _ in range(3):
            t0 = time.perf_counter()
            n = run()
            walls.append(time.perf_counter() - t0)
        return statistics.median(walls), n

    figures: dict[str, object] = {}
    for n in args.rules:
        rs = [parse_rule(r) for r in rules(n)]
        spec = rule_set_spec(threshold_rows(rs))

        def evaluator(spec: str = spec) -> int:
            return parsed.select(F.explode(thresholds(spark, F.col("topic"), F.col("v"), spec)["m"])).count()

        def expressions(rs: list = rs) -> int:
            # The form the rules had before the evaluator: every rule's conditions as
            # Spark expressions in one projection (engine/threshold.py before issue 41).
            events, fields = fields_of(parsed, rs)
            hits = matching([all_conditions(F.col("v"), r.conditions, fields.values) for r in rs])
            return explode_matching(events, hits, ["seq"]).count()

        (we, ne), (wx, nx) = timed(evaluator), timed(expressions)
        print(f"{n} rules: evaluator {we:.2f} s, expressions {wx:.2f} s, matches {ne} / {nx}")
        figures.update({f"evaluator_s_{n}": round(we, 3), f"expressions_s_{n}": round(wx, 3), f"matches_{n}": ne,
                        f"agree_{n}": ne == nx})
    spark.stop()
    append_result("rule_set", figures, events=args.events)


if __name__ == "__main__":
    main()
