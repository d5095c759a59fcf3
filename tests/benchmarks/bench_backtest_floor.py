"""The floor under the backtest: the whole of bench_backtest.py's run, written by hand
as the cheapest Spark plan for exactly its rule set and data, on this machine.

    python tests/benchmarks/bench_backtest_floor.py [--events 1000000] [--keep DIR] [--table]

Same events and rules as bench_backtest.py (1M JSON lines; 50 threshold, 10 velocity,
2 correlation rules), same local[2] session. No rule engine: every rule is spelled out
as a literal Spark expression, and every shortcut that is only right for this data is
taken, so the time is a lower bound for any engine that evaluates these rules on Spark:

  parse   read the lines and parse the fields the rules read with from_json and a typed
          schema. The rule language needs more (it tells 1 from "1", keys compare by
          JSON value), so this is cheaper than any correct parse.
  rules   from the parsed events (cached; building the cache is not timed):
          - threshold: the 50 rules as literal comparisons in one projection, the
            matches exploded (`matching`: the cheapest form found,
            cheaper than an array compacted by a higher-order function);
          - velocity: the 9 per-user rules in one shuffle and sort by (user, ts), each
            a plain range window in DOUBLE (right here because no two events share a
            timestamp), `last_event` as a lag; the global rule in one partition;
          - correlation: primaries and context in one sort by pair, `last` and
            mean/std as prefix windows, no pending primaries or dead letters;
          - every detection rendered as the sink line (event text, rule members, sha2
            id), all sorted by time into one JSON Lines file.

`--table`: "parse" is reading the records from a Delta table shaped like the event
archive (bench_backtest.py --table writes it, untimed, into the same --keep folder) and
taking the fields from its already-parsed VARIANT with typed `variant_get`: the floor
under `rulectl backtest --history`.

Each part is timed warm: best of --reps runs, JIT compiled. `--parts` also times the
rule kinds alone (to the noop sink, without output), to show where the time goes.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from functools import reduce
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
from bench_backtest import (  # noqa: E402
    GLOBAL_THRESHOLD,
    GLOBAL_VELOCITY,
    VELOCITY_AGGS,
    VELOCITY_THRESHOLDS,
    archive_table,
    make_events,
    threshold_rule,
    velocity_window_s,
)
from record import append_result  # noqa: E402

# The fields the rules read, and no others.
SCHEMA = ("type string, amount double, user_id string, merchant string, ts long, "
          "currency_pair string, implied_rate double, rate double")


def best(reps: int, fn: Callable[[], object]) -> float:
    times = []
    for _ in range(reps):
        t = time.time()
        fn()
        times.append(time.time() - t)
    return min(times)


def main() -> None:  # noqa: PLR0915 - one plan, written out in full on purpose
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--keep", type=Path)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--conf", action="append", default=[], help="extra Spark setting KEY=VALUE (repeatable)")
    ap.add_argument("--parts", action="store_true", help="also time threshold/velocity/correlation alone")
    ap.add_argument("--table", action="store_true", help="read the records from a Delta archive table")
    args = ap.parse_args()
    from pyspark.sql import Column, DataFrame, Window
    from pyspark.sql import functions as F

    from spark_jobs.spark import session

    def matching(flags: list[Column]) -> Column:
        """The indexes of the true `flags` as text, "0,3": concat_ws skips NULLs in
        generated code (an array compacted by a higher-order function is interpreted)."""
        return F.concat_ws(",", *[F.when(f, F.lit(str(i))) for i, f in enumerate(flags)])

    def explode_matching(df: DataFrame, matches: Column, keep: list[str], name: str) -> DataFrame:
        """One row per index in `matches`, as int column `name`."""
        return (df.select(*keep, F.explode(F.split(matches, ",")).alias("_m")).filter(F.col("_m") != F.lit(""))
                .select(*keep, F.col("_m").cast("int").alias(name)))

    work = args.keep or Path(tempfile.mkdtemp(prefix="bench-floor-"))
    work.mkdir(parents=True, exist_ok=True)
    ev, ctx = work / "events.jsonl", work / "context.jsonl"
    if not ev.exists():
        make_events(ev, ctx, args.events)
    extra = dict(c.split("=", 1) for c in args.conf)
    spark = session("backtest-floor", master="local[2]", shuffle_partitions=4, extra=extra)
    spark.range(10).count()

    def noop(df: DataFrame) -> Callable[[], None]:
        return lambda: df.write.format("noop").mode("overwrite").save()

    def parsed(path: Path, topic: str) -> DataFrame:
        raw = spark.read.text(str(path)).select(F.col("value").alias("raw"))
        return raw.select(F.lit(topic).alias("topic"), "raw", F.from_json("raw", SCHEMA).alias("j")).select(
            "topic", "raw", "j.*"
        )

    def from_table() -> DataFrame:
        """The archive's window, each field the rules read taken from the VARIANT, typed.
        Delta's read with the window's bounds as literal filters (pruned by partition and
        file statistics), not the platform's `read_window`."""
        history = archive_table(spark, work, ev, ctx)
        lo, hi = (int(t.timestamp() * 1000) for t in (history.start, history.end))
        window = (spark.read.format("delta").load(history.table)
                  .filter(F.col("topic").isin("events.raw", "context.raw"))
                  .filter(F.col("date").between(F.lit(history.start.date()), F.lit(history.end.date())))
                  .filter((F.col("timestamp") >= F.timestamp_millis(F.lit(lo)))
                          & (F.col("timestamp") < F.timestamp_millis(F.lit(hi)))))
        typed = [F.expr(f"variant_get(v, '$.{name}', '{kind}')").alias(name)
                 for name, kind in (f.split(" ") for f in SCHEMA.split(", "))]
        return window.select("topic", F.col("value").cast("string").alias("raw"), *typed)

    both = from_table() if args.table else parsed(ev, "events.raw").unionByName(parsed(ctx, "context.raw"))
    parse_s = best(args.reps, noop(both))
    cached = both.persist()
    cached.count()
    events = cached.filter(F.col("topic") == "events.raw")

    def rendered(df: DataFrame, rule_id: Column, extra: Column) -> DataFrame:
        """The sink line: the event's members, the rule's, the detection id."""
        did = F.substring(F.sha2(F.concat_ws("\u001f", rule_id, F.lit("1"), "topic", "raw"), 256), 1, 32)
        body = F.expr("substring(raw, 1, length(raw) - 1)")
        return df.select("ts", F.concat(
            body, F.lit(',"rule_id":"'), rule_id, F.lit('","rule_version":"1","processed":"2026-01-01T00:00:00Z"'),
            extra, F.lit(',"detection_id":"'), did, F.lit('"}'),
        ).alias("value"))

    # Threshold: which of the 50 rules each event matches, exploded.
    th = matching([(F.col("type") == t) & (F.col("amount") >= a) for t, a in map(threshold_rule, range(50))])
    th_hits = explode_matching(events, th, ["topic", "raw", "ts"], "i")
    threshold = rendered(th_hits, F.format_string("th_%02d", "i"), F.lit(""))

    # Velocity: nine per-user rules in one sort, the global one alone.
    moving = events.filter((F.col("type") != "view") & F.col("ts").isNotNull())
    by_user = Window.partitionBy("user_id").orderBy("ts")
    grouped = [i for i in range(len(VELOCITY_AGGS)) if i != GLOBAL_VELOCITY]

    def agg(i: int) -> Column:
        frame = by_user.rangeBetween(-(velocity_window_s(i) * 1000 - 1), 0)
        kind = VELOCITY_AGGS[i]
        if kind == "count":
            return F.count(F.lit(1)).over(frame).cast("double")
        if kind == "distinct_count":
            return F.size(F.collect_set("merchant").over(frame)).cast("double")
        return getattr(F, kind)("amount").over(frame)

    aggs = moving.filter(F.col("user_id").isNotNull()).select(
        "topic", "raw", "ts", "user_id", *[agg(i).alias(f"a{i}") for i in grouped]
    ).select("*", *[F.lag(f"a{i}").over(by_user).alias(f"p{i}") for i in grouped],
             F.lag("ts").over(by_user).alias("pt"))

    def crossed(a: Column, prev: Column, threshold: float, window_s: int) -> Column:
        """`last_event`: above the threshold where the key's previous event was not, or
        is out of the window (a new episode)."""
        return (a >= threshold) & (prev.isNull() | (prev < threshold)
                                   | (F.col("pt") <= F.col("ts") - F.lit(window_s * 1000)))

    fires = matching([crossed(F.col(f"a{i}"), F.col(f"p{i}"), VELOCITY_THRESHOLDS[VELOCITY_AGGS[i]],
                              velocity_window_s(i)) for i in grouped])
    values = F.array(*[F.col(f"a{i}") for i in grouped])
    fired = explode_matching(aggs.select("topic", "raw", "ts", fires.alias("m"), values.alias("values")),
                             F.col("m"), ["topic", "raw", "ts", "values"], "j")
    fired = fired.select("topic", "raw", "ts", F.element_at(F.array(*map(F.lit, grouped)), F.col("j") + 1).alias("i"),
                         F.element_at("values", F.col("j") + 1).alias("a"))
    everyone = Window.orderBy("ts")
    # A sliding frame is re-aggregated whenever it moves: 22k rows per frame here, so
    # quadratic. Two prefix frames (all so far, less all up to t - W) are linear.
    global_ms = velocity_window_s(GLOBAL_VELOCITY) * 1000
    upto_low = F.count(F.lit(1)).over(everyone.rangeBetween(Window.unboundedPreceding, -global_ms))
    glob = moving.select("topic", "raw", "ts", (F.row_number().over(everyone) - upto_low).alias("a"))
    glob_fired = glob.withColumn("p", F.lag("a").over(everyone)).withColumn("pt", F.lag("ts").over(everyone)).filter(
        crossed(F.col("a"), F.col("p"), GLOBAL_THRESHOLD, velocity_window_s(GLOBAL_VELOCITY)))
    members = F.concat(F.lit(',"aggregation_value":'), F.col("a").cast("string"))
    per_user = rendered(fired, F.format_string("vel_%d", "i"), members)
    velocity = per_user.unionByName(rendered(glob_fired, F.lit(f"vel_{GLOBAL_VELOCITY}"), members))

    # Correlation: per pair, the last context rate (5 min) and mean/std (10 min).
    context = cached.filter(F.col("topic") == "context.raw").select("ts", "currency_pair", "rate")
    primaries = events.filter(F.col("currency_pair").isNotNull() & F.col("implied_rate").isNotNull())
    timeline = primaries.select("topic", "raw", "ts", "currency_pair", "implied_rate", F.lit(None).cast("double").alias("rate")) \
        .unionByName(context.select(*[F.lit(None).cast("string").alias(c) for c in ("topic", "raw")], "ts", "currency_pair",
                                    F.lit(None).cast("double").alias("implied_rate"), "rate"))
    by_pair = Window.partitionBy("currency_pair").orderBy("ts")
    upto = by_pair.rowsBetween(Window.unboundedPreceding, 0)
    before = by_pair.rangeBetween(Window.unboundedPreceding, -600_001)

    def in_window(agg: Column) -> Column:
        return agg.over(upto) - F.coalesce(agg.over(before), F.lit(0))

    stats = timeline.select(
        "topic", "raw", "ts", "implied_rate",
        F.last("rate", ignorenulls=True).over(upto).alias("last"),
        F.last(F.when(F.col("rate").isNotNull(), F.col("ts")), ignorenulls=True).over(upto).alias("last_ts"),
        in_window(F.count("rate")).alias("n"), in_window(F.sum("rate")).alias("s1"),
        in_window(F.sum(F.col("rate") * F.col("rate"))).alias("s2"),
    ).filter(F.col("raw").isNotNull())
    judged = stats.select(
        "topic", "raw", "ts", "implied_rate", "n", (F.col("s1") / F.col("n")).alias("mean"),
        F.when(F.col("ts") - F.col("last_ts") <= 300_000, F.col("last")).alias("last"),
        F.sqrt((F.col("s2") - F.col("s1") * F.col("s1") / F.col("n")) / (F.col("n") - 1)).alias("std"),
    )
    fx = judged.filter(F.abs(F.col("implied_rate") / F.col("last") - 1) > 0.02)
    z = judged.filter((F.col("n") >= 3) & (F.abs(F.col("implied_rate") - F.col("mean")) / F.col("std") > 3))
    correlation = rendered(fx.withColumn("a", F.col("implied_rate") / F.col("last") - 1), F.lit("corr_fx"),
                           F.concat(F.lit(',"metric_value":'), F.col("a").cast("string"))) \
        .unionByName(rendered(z.withColumn("a", (F.col("implied_rate") - F.col("mean")) / F.col("std")),
                              F.lit("corr_z"), F.concat(F.lit(',"metric_value":'), F.col("a").cast("string"))))

    detections = reduce(DataFrame.unionByName, [threshold, velocity, correlation])
    out = str(work / "floor-detections")
    rules_s = best(args.reps, lambda: detections.repartition(1).sortWithinPartitions("ts").select("value")
                   .write.mode("overwrite").text(out))
    n_det = spark.read.text(out).count()
    total = parse_s + rules_s
    print(f"machine: {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}, local[2]")
    what = "read from the Delta table, variant_get, typed" if args.table else "parse (from_json, typed)"
    print(f"{what} of {args.events} events: {parse_s:.2f}s")
    alone = {}
    if args.parts:
        parts = (("threshold", threshold), ("velocity", velocity), ("  of which per user", per_user),
                 ("correlation", correlation))
        for name, df in parts:
            alone[name.strip()] = round(best(args.reps, noop(df)), 2)
            print(f"  {name} alone, to noop: {alone[name.strip()]:.2f}s")
    print(f"rules and output ({n_det} detections, sorted, one file): {rules_s:.2f}s")
    print(f"floor: {total:.2f}s -> at most {args.events / total:,.0f} events/s")
    figures = {"parse_s": round(parse_s, 2), "rules_s": round(rules_s, 2), "floor_s": round(total, 2),
               "events_per_s": round(args.events / total), "detections": n_det}
    if alone:
        figures["alone_to_noop_s"] = alone
    append_result("backtest_floor", figures, events=args.events, source="table" if args.table else "json",
                  reps=args.reps)


if __name__ == "__main__":
    main()
