"""The JVM keyed operator (spark_jobs/jvm/processor, jvm_operator.py) on its own, in a
streaming query on real Spark: every kind of outcome over random key rows, its state
store going back down as keys come and go, and its number arithmetic and text.

The input is one file per micro-batch (maxFilesPerTrigger 1), rows as the rule-set
evaluator makes them (keyed_input.py: one per (event, key group), `mem` holding the rule
rows the event enters, each by its index in the published version), from a seeded
generator:
every velocity aggregation and emit mode, a processing-time rule, a routed velocity
rule, correlation rules of every resolution and metric (also on routed primaries),
equal timestamps, fractional, huge and tiny values, late rows, rows without a usable
timestamp (with and without the too-far-ahead `issue`), rules sharing a key group, two groups.
"""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import pytest
from detect_harness import job_state_store
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from spark_jobs.streaming.jvm_operator import keyed_operator
from spark_jobs.streaming.keyed_rows import OUTPUT_SCHEMA
from spark_jobs.streaming.registry import ROUTED_TOPIC
from spark_jobs.streaming.rule_versions import current, publish
from spark_jobs.streaming.rules_source import rows_of

pytestmark = pytest.mark.spark

BASE = 1_767_600_000_000


def _velocity(rid: str, kind: str, window_s: float, threshold: float, **extra) -> dict:
    d = {"rule_id": rid, "version": "1", "rule_type": "velocity", "source_topic": "t", "group_by": "user",
         "window_size": window_s, "window_unit": "seconds", "aggregation_type": kind, "threshold": threshold,
         "time_mode": "event_time", "timestamp_field": "ts", "watermark_delay": 2}
    if kind != "count":
        d["aggregation_field"] = "amount" if kind != "distinct_count" else "m"
    return {**d, **extra}


def _correlation(rid: str, resolution: str, metric: str, op: str, value: object, **extra) -> dict:
    d = {"rule_id": rid, "version": "1", "rule_type": "correlation", "source_topic": "t", "context_topic": "ctx",
         "correlation_key": "pair", "window_size": 5, "window_unit": "seconds", "context_resolution": resolution,
         "context_value_field": "rate", "timestamp_field": "ts", "metric": metric,
         "condition": {"operator": op, "value": value}, "watermark_delay": 2}
    if metric != "direct":
        d["event_value_field"] = "r"
    return {**d, **extra}


# Key group "user": velocity rules; key group "pair": correlation rules.
VELOCITY = [
    _velocity("v_count", "count", 10, 3),
    _velocity("v_count_all", "count", 3, 2, emit_mode="all_events", watermark_delay=1),
    _velocity("v_sum", "sum", 8, 60),
    _velocity("v_sum_all", "sum", 2.5, 0.3, emit_mode="all_events"),
    _velocity("v_avg", "avg", 8, 41.3, emit_mode="all_events"),
    _velocity("v_min", "min", 5, 20),
    _velocity("v_max", "max", 4, 50, emit_mode="all_events", watermark_delay=1),
    _velocity("v_distinct", "distinct_count", 6, 2),
    _velocity("v_proc", "count", 4, 2, time_mode="processing_time", timestamp_field=None),
    _velocity("v_routed", "sum", 5, 10, emit_to_sink=False),
]
CORRELATION = [
    _correlation("c_last_ratio", "last", "ratio_deviation", ">", 0.02),
    _correlation("c_last_direct_str", "last", "direct", "==", "high"),
    _correlation("c_last_direct_num", "last", "direct", ">=", 1.05, max_context_age_seconds=3),
    _correlation("c_last_ne", "last", "direct", "!=", True),
    _correlation("c_mean", "mean", "direct", ">", 1.02, min_context_points=2),
    _correlation("c_z", "mean_std", "z_score", ">", 1, min_context_points=2, window_size=6),
    _correlation("c_diff", "mean", "difference", "<", -0.01),
    _correlation("c_routed", "last", "difference", ">", 0, velocity_filter_rule_id="v_routed"),
]


class Slot(NamedTuple):
    """A keyed rule row of the published version, by its index there."""

    rule_id: str
    role: str
    event_time: bool
    rule_type: str


def _slots(versions: Path, rules: list[dict]) -> list[Slot]:
    """`rules` published as the current version in `versions`, as the job publishes
    them; its keyed rule rows (one per role a rule plays) in their order."""
    publish(versions, rows_of({d["rule_id"]: d for d in rules}, ROUTED_TOPIC))
    spec = json.loads((versions / "specs" / f"{current(versions)}.json").read_text())
    return [Slot(k["rule"]["rule_id"], k["role"], k["event_time"], k["rule"]["rule_type"]) for k in spec["keyed"]]


def _groups(slots: list[Slot]) -> dict[str, list[int]]:
    """Per key group the indexes of its slots: velocity rules by user, correlation by pair."""
    velocity = {d["rule_id"] for d in VELOCITY}
    groups: dict[str, list[int]] = {"user": [], "pair": []}
    for i, s in enumerate(slots):
        groups["user" if s.rule_id in velocity else "pair"].append(i)
    return groups


FAR = "event time more than 5000 ms ahead of the record's broker timestamp"
MEMBERS = "array<struct<i:int,ts:bigint,issue:string,num:double,jv:string>>"
SCHEMA = f"gid string, k string, mem {MEMBERS}, topic string, seq long, raw string, proc_ms long, wm long"


VALUES = [5.0, 20.0, 40.0, 65.0, 70.0, 0.1, 0.2, 1 / 3, 1e16, -1e16, 1.0, 1e-300, 5e-324, 2.5e300, -7.25]
RATES = [1.0, 1.01, 1.05, 1.1, 0.97, 0.1, 1 / 3]
TEXTS = ['"m0"', '"m1"', '"m2"', "3", "null", '"high"', '"1.2"', "1.07", "true", "false", '" 1e0 "']


def _batches(rnd: random.Random, slots: list[Slot], n: int) -> list[list[dict]]:
    """Input rows per micro-batch: bursts, gaps longer than a window (expiry), equal and
    out-of-order times, late rows (times far behind), rows without a usable time."""
    groups = _groups(slots)
    out, now, seq = [], BASE, 0
    users, pairs = [f'"u{i}"' for i in range(6)], ['"EURUSD"', '"GBPUSD"']
    for _ in range(n):
        now += rnd.choice([0, 200, 300, 700, 1500, 4000, 9000, 20_000])
        rows = []
        for _ in range(rnd.randrange(0, 20)):
            seq += 1
            gid = rnd.choice(["user", "pair"])
            ts = now - rnd.choice([0, 0, 0, 0, 200, 900, 3000, 9000, 15_000])
            row: dict = {"gid": gid, "k": rnd.choice(users if gid == "user" else pairs), "seq": seq,
                         "topic": "t", "raw": json.dumps({"seq": seq}), "proc_ms": now + rnd.randrange(3)}
            members = groups[gid]
            if gid == "pair":  # a primary (source or routed) or a context record
                context = rnd.random() < 0.45
                row["topic"] = "ctx" if context else rnd.choice(["t", "detect.routed"])
                members = [i for i in members if (slots[i].role == "context") == context]
            chosen = [i for i in members if rnd.random() < 0.6] or [rnd.choice(members)]
            missing = rnd.random() < 0.03
            ahead = rnd.random() < 0.02
            wm = []
            row["mem"] = []
            for i in chosen:
                member = {"i": i, "ts": row["proc_ms"], "issue": None,
                          "num": rnd.choice(RATES if gid == "pair" and rnd.random() < 0.9 else VALUES),
                          "jv": rnd.choice(TEXTS)}
                if slots[i].event_time:
                    # The evaluator gives a row without a usable time its reason (docs/rule-language.md).
                    member.update(ts=None if missing else ts, issue=FAR if ahead else (
                        f"missing or unparseable timestamp field 'ts' needed by {slots[i].rule_type} rule"
                        if missing else None))
                    if not missing and not ahead:
                        wm.append(ts)
                row["mem"].append(member)
            row["wm"] = max(wm) if wm else None
            rows.append(row)
        out.append(rows)
    out.append(_overflowing(slots, now + 60_000, seq))
    return out


def _overflowing(slots: list[Slot], ts: int, seq: int) -> list[dict]:
    """A batch whose mean_std context overflows `(x - mean) ** 2` (2.5e300): the key's rows
    of that rule become "rule evaluation failed" dead letters, the other rules go on."""
    ctx = next(i for i, s in enumerate(slots) if s.rule_id == "c_z" and s.role == "context")
    src = next(i for i, s in enumerate(slots) if s.rule_id == "c_z" and s.role == "source")
    rows = []
    for n, (slot, num, topic) in enumerate([(ctx, 2.5e300, "ctx"), (ctx, 1.0, "ctx"), (src, 1.0, "t")]):
        rows.append({"gid": "pair", "k": '"EURUSD"', "topic": topic, "seq": seq + 1 + n,
                     "raw": json.dumps({"seq": seq + 1 + n}), "proc_ms": ts, "wm": ts,
                     "mem": [{"i": slot, "ts": ts, "issue": None, "num": num, "jv": "1"}]})
    return rows


def _write_batches(spark, batches: list[list[dict]], tmp_path: Path) -> Path:
    """One parquet file per micro-batch, in order, in a folder the stream reads."""
    src = tmp_path / "in"
    src.mkdir()
    names = [c.split()[0] for c in SCHEMA.split(", ")]
    for b, rows in enumerate(batches):
        df = spark.createDataFrame([{c: r.get(c) for c in names} for r in rows], SCHEMA)
        df.coalesce(1).write.parquet(str(tmp_path / "stage" / str(b)))
        next((tmp_path / "stage" / str(b)).glob("part-*.parquet")).rename(src / f"{b:04d}.parquet")
    return src


def test_jvm_operator_over_random_key_rows(spark, tmp_path: Path):
    """Every outcome the operator has, over 40 micro-batches with state and watermark
    carried over: detections and routed emits of every rule, late rows, rows without a
    usable time, and a key whose evaluation fails (dead letters, the batch goes on)."""
    from pyspark.sql import functions as F

    versions = tmp_path / "versions"
    slots = _slots(versions, VELOCITY + CORRELATION)
    rnd = random.Random("jvm-keyed-operator")
    src = _write_batches(spark, _batches(rnd, slots, 40), tmp_path)

    keyed = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(src))
    watermarked = keyed.withColumn("wm_ts", F.timestamp_millis(F.col("wm"))).withWatermark("wm_ts", "2000 milliseconds")
    stateful_in = watermarked.select(*[c for c in keyed.columns if c != "wm"],
                                     F.pmod(F.xxhash64("k"), F.lit(3)).cast("int").alias("bucket"))
    jvm = keyed_operator(stateful_in, str(versions))

    got: dict[int, Counter] = {}

    def collect(df, batch_id: int) -> None:
        for r in df.collect():
            d = r.asDict()
            got.setdefault(batch_id, Counter())[tuple(d[f.name] for f in OUTPUT_SCHEMA.fields)] += 1

    with job_state_store(spark):
        q = (jvm.writeStream.foreachBatch(collect).option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
        q.awaitTermination(600)
    assert q.exception() is None
    rows = Counter()
    for c in got.values():
        rows.update(c)
    kinds = Counter(r[0] for r in rows.elements())
    reasons = {r[-1] for r in rows if r[0] == "dead"}
    fired = {r[1] for r in rows if r[0] in ("detection", "routed")}
    assert kinds["detection"] > 0 and kinds["routed"] > 0, kinds
    assert any(x.startswith("late event") for x in reasons), reasons
    assert {"missing or unparseable timestamp field 'ts' needed by velocity rule",
            "missing or unparseable timestamp field 'ts' needed by correlation rule"} <= reasons, reasons
    assert any(x.startswith("event time more than") for x in reasons), reasons
    # mean_std of a context holding 2.5e300: (x - mean) ** 2 overflows, the key's rows are dead letters
    assert "rule evaluation failed: squared deviation from the mean exceeds the double range" in reasons, reasons
    assert fired == {d["rule_id"] for d in VELOCITY + CORRELATION}, fired
    assert len(got) > 10  # several micro-batches, state and watermark carried over


def test_sums_and_averages_over_batches_are_exact(spark, tmp_path: Path):
    """A sum or avg window keeps its exact sum with the key's state and goes on from it
    when a batch's rows all come after the stored ones; rows older than the stored ones
    (out of order, within the window) make it sum afresh. Either way every value is the
    definition's: the exact sum of the window's values, rounded once (math.fsum), over
    the stored rows up to the row's time and the batch's rows up to the row itself."""
    from pyspark.sql import functions as F

    window_ms = 10_000
    rules = [_velocity("s_sum", "sum", 10, -1e308, emit_mode="all_events", watermark_delay=60),
             _velocity("s_avg", "avg", 10, -1e308, emit_mode="all_events", watermark_delay=60)]
    versions = tmp_path / "versions"
    assert [s.rule_id for s in _slots(versions, rules)] == ["s_sum", "s_avg"]
    rnd = random.Random("exact-sums")
    values = [0.1, 0.2, 0.3, 1e16, -1e16, 1.0, 3.5, -7.25, 1 / 3, 5e-324, 2.5e300, -2.5e300]
    batches, seq, now = [], 0, BASE
    for _ in range(25):
        now += rnd.choice([300, 900, 2500, 12_000])
        rows = []
        for _ in range(rnd.randrange(1, 8)):
            seq += 1
            # Mostly at the batch's time; some behind the key's newest stored row.
            ts = now - rnd.choice([0, 0, 0, 100, 1500, 6000])
            x = rnd.choice(values)
            rows.append({"gid": "user", "k": rnd.choice(['"a"', '"b"']), "topic": "t", "seq": seq,
                         "raw": json.dumps({"seq": seq}), "proc_ms": now, "wm": ts,
                         "mem": [{"i": 0, "ts": ts, "num": x}, {"i": 1, "ts": ts, "num": x}]})
        batches.append(rows)
    src = _write_batches(spark, batches, tmp_path)

    expected: dict[tuple[str, int], float] = {}
    stored: dict[str, list[tuple[int, float]]] = {}
    for rows in batches:
        for k in {r["k"] for r in rows}:
            mine = sorted((r for r in rows if r["k"] == k), key=lambda r: (r["mem"][0]["ts"], r["seq"]))
            for n, r in enumerate(mine):
                t = r["mem"][0]["ts"]
                window = [x for ts, x in stored.get(k, []) if t - window_ms < ts <= t]
                window += [o["mem"][0]["num"] for o in mine[: n + 1] if o["mem"][0]["ts"] > t - window_ms]
                expected[("s_sum", r["seq"])] = math.fsum(window)
                expected[("s_avg", r["seq"])] = math.fsum(window) / len(window)
            stored.setdefault(k, []).extend((r["mem"][0]["ts"], r["mem"][0]["num"]) for r in mine)

    keyed = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(src))
    watermarked = keyed.withColumn("wm_ts", F.timestamp_millis(F.col("wm"))).withWatermark("wm_ts", "60 seconds")
    stateful_in = watermarked.select(*[c for c in keyed.columns if c != "wm"],
                                     F.pmod(F.xxhash64("k"), F.lit(2)).cast("int").alias("bucket"))
    got: dict[tuple[str, int], float] = {}

    def collect(df, _: int) -> None:
        for r in df.collect():
            assert r["kind"] == "detection", r
            got[(r["rule_id"], json.loads(r["raw"])["seq"])] = r["agg_value"]

    with job_state_store(spark):
        q = (keyed_operator(stateful_in, str(versions)).writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
        q.awaitTermination(600)
    assert q.exception() is None
    assert got == expected


def test_a_long_window_is_kept_in_chunks_across_a_restart(spark, tmp_path: Path):
    """A key whose window holds about 2,000 events (20 s at 100 a second) is stored in
    sealed chunks of 512 events beside its sub-state (SubState, in the key's one entry,
    KeyState): the store holds more entries than sub-states, and few enough that the
    window was not kept whole and its old chunks went. Every row's count, exact sum and distinct count are the definition's
    over the rows before it (some rows up to 1.5 s out of order, within the watermark's
    delay), across a restart on the checkpoint halfway."""

    window_ms = 20_000
    rules = [_velocity("l_count", "count", 20, 0, emit_mode="all_events", watermark_delay=5),
             _velocity("l_sum", "sum", 20, -1e308, emit_mode="all_events", watermark_delay=5),
             _velocity("l_distinct", "distinct_count", 20, 0, emit_mode="all_events", watermark_delay=5)]
    versions = tmp_path / "versions"
    assert [s.rule_id for s in _slots(versions, rules)] == ["l_count", "l_sum", "l_distinct"]
    rnd = random.Random("long-window")
    batches, seq, now = [], 0, BASE
    for _ in range(14):
        rows = []
        for j in range(500):
            seq += 1
            ts = now + j * 10 - (rnd.choice([0] * 9 + [1500]) if j else 0)
            x, text = rnd.choice([0.1, 0.2, 1e16, -1e16, 3.5, 1 / 3]), f'"m{rnd.randrange(40)}"'
            rows.append({"gid": "user", "k": '"a"', "topic": "t", "seq": seq, "raw": json.dumps({"seq": seq}),
                         "proc_ms": ts, "wm": ts, "mem": [{"i": i, "ts": ts, "num": x, "jv": text} for i in range(3)]})
        batches.append(rows)
        now += 5_000

    # The definition: a row's window is the key's earlier batches' rows with time in
    # (t - window, t] and its own batch's rows up to itself in (time, seq) order.
    expected: dict[tuple[str, int], float] = {}
    stored: list[tuple[int, float, str]] = []
    for rows in batches:
        mine = sorted(rows, key=lambda r: (r["mem"][0]["ts"], r["seq"]))
        for n, r in enumerate(mine):
            t = r["mem"][0]["ts"]
            window = [(x, text) for ts, x, text in stored if t - window_ms < ts <= t]
            window += [(o["mem"][0]["num"], o["mem"][0]["jv"]) for o in mine[: n + 1]
                       if o["mem"][0]["ts"] > t - window_ms]
            expected[("l_count", r["seq"])] = float(len(window))
            expected[("l_sum", r["seq"])] = math.fsum(x for x, _ in window)
            expected[("l_distinct", r["seq"])] = float(len({text for _, text in window}))
        stored.extend((r["mem"][0]["ts"], r["mem"][0]["num"], r["mem"][0]["jv"]) for r in mine)
        stored = [e for e in stored if e[0] > mine[-1]["mem"][0]["ts"] - 2 * window_ms]
    src = _write_batches(spark, batches, tmp_path)
    parked = tmp_path / "later"
    parked.mkdir()
    for f in sorted(src.iterdir())[7:]:
        f.rename(parked / f.name)

    got: dict[tuple[str, int], float] = {}
    entries: list[int] = []

    def collect(df, _: int) -> None:
        for r in df.collect():
            assert r["kind"] == "detection", r
            got[(r["rule_id"], json.loads(r["raw"])["seq"])] = r["agg_value"]

    def run() -> None:
        q = _run_one_bucket(spark, src, versions, tmp_path / "ckpt", "5 seconds", collect)
        entries.extend(p["stateOperators"][0]["numRowsTotal"] for p in q.recentProgress if p["stateOperators"])

    run()
    for f in sorted(parked.iterdir()):
        f.rename(src / f.name)
    run()
    assert got.keys() == expected.keys()
    assert {k: v for k, v in got.items() if v != expected[k]} == {}
    # The key's entry (three sub-states) and the bucket's timer, plus the long windows'
    # chunks: each keeps at most ~3,000 events (the window, the watermark's 5 s and a
    # batch), 512 a chunk and the newest up to 1,023 open; 7,000 events went through it.
    assert max(entries) > 3 * 3, entries
    assert max(entries) <= 2 + 3 * (3_100 // 512 + 1), entries


def test_a_new_version_keeps_the_window_unless_what_enters_changes(spark, tmp_path: Path):
    """docs/rule-language.md: a new version of a velocity rule keeps its keys' windows
    when only the threshold (or emit mode) changed, and starts them afresh when what
    enters changed (conditions, grouping, value or time fields). A count rule over one
    key, all_events, one micro-batch per version (a restart on the checkpoint between,
    so each batch takes the version published before it):

    - v1, threshold 4: rows at t, t+1 s: counts 1 and 2, nothing detected;
    - v2, threshold 3 only: a row at t+2 s counts 3 (the window kept): detected, 3;
    - v3, a new condition: a row at t+3 s counts 1 (the window started afresh): none;
    - v4, threshold 1 only: a row at t+4 s counts 2 (v3's window kept): detected, 2.
    """

    def rule(version: str, threshold: float, **extra) -> dict:
        return _velocity("v_count", "count", 60, threshold, version=version, emit_mode="all_events", **extra)

    versions = tmp_path / "versions"
    src = tmp_path / "src"
    src.mkdir()
    got: list[tuple[str, int, float]] = []

    def collect(df, _: int) -> None:
        for r in df.collect():
            assert r["kind"] == "detection", r
            got.append((r["rule_version"], json.loads(r["raw"])["seq"], r["agg_value"]))

    steps = [(rule("1", 4), [0, 1]), (rule("2", 3), [2]),
             (rule("3", 3, conditions=[{"field": "type", "operator": "==", "value": "click"}]), [3]),
             (rule("4", 1, conditions=[{"field": "type", "operator": "==", "value": "click"}]), [4])]
    for n, (published, seconds) in enumerate(steps):
        assert [s.rule_id for s in _slots(versions, [published])] == ["v_count"]
        rows = [{"gid": "user", "k": '"a"', "topic": "t", "seq": s, "raw": json.dumps({"seq": s}),
                 "proc_ms": BASE + s * 1000, "wm": BASE + s * 1000, "mem": [{"i": 0, "ts": BASE + s * 1000}]}
                for s in seconds]
        spark.createDataFrame(rows, SCHEMA).coalesce(1).write.parquet(str(tmp_path / "stage" / str(n)))
        next((tmp_path / "stage" / str(n)).glob("part-*.parquet")).rename(src / f"{n:04d}.parquet")
        _run_one_bucket(spark, src, versions, tmp_path / "ckpt", "2 seconds", collect)
    assert got == [("2", 2, 3.0), ("4", 4, 2.0)]


def _run_one_bucket(spark, src: Path, versions: Path, checkpoint: Path, delay: str, collect):  # noqa: ANN001, ANN202
    """The operator over the files in `src` (one a micro-batch, all in bucket 0, the
    watermark `delay` behind `wm`) until they are read, on `checkpoint`; each batch's
    output to `collect`. The query, finished."""
    from pyspark.sql import functions as F

    keyed = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(src))
    watermarked = keyed.withColumn("wm_ts", F.timestamp_millis(F.col("wm"))).withWatermark("wm_ts", delay)
    stateful_in = watermarked.select(*[c for c in keyed.columns if c != "wm"], F.lit(0).alias("bucket"))
    with job_state_store(spark):
        q = (keyed_operator(stateful_in, str(versions)).writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start())
        q.awaitTermination(600)
    assert q.exception() is None
    return q


def _run_availably(spark, stream, tmp_path: Path) -> list[dict]:
    """Run `stream` to a noop sink over all its input (one file a batch) with the job's
    state store; the query's progress per batch."""
    with job_state_store(spark):
        q = (stream.writeStream.format("noop").option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
        q.awaitTermination(600)
    assert q.exception() is None
    return q.recentProgress


def test_jvm_operator_state_goes_back_down_when_short_lived_keys_come_and_go(spark, tmp_path: Path):
    """The default live operator's state store, as Spark reports it (numRowsTotal): 40
    micro-batches of 100 new keys each, every key seen in one batch only, for an
    event-time and a processing-time velocity rule. Event-time sub-states expire by the
    bucket's timer once the watermark passes them; processing-time ones are swept when
    newer rows of their rule reach their bucket. 4,000 keys come and go; the store holds
    a batch or two's worth at any time, however many keys came before."""
    from pyspark.sql import functions as F

    rules = [_velocity("v_event", "count", 2, 5, watermark_delay=1),
             _velocity("v_proc", "count", 2, 5, time_mode="processing_time", timestamp_field=None)]
    versions = tmp_path / "versions"
    assert [s.rule_id for s in _slots(versions, rules)] == ["v_event", "v_proc"]
    per_batch, n_batches, seq = 100, 40, 0
    batches = []
    for b in range(n_batches):
        rows = []
        for j in range(per_batch):
            ts = BASE + b * 10_000 + j
            for _ in range(2):
                seq += 1
                rows.append({"gid": "user", "k": f'"b{b}_{j}"', "topic": "t", "seq": seq,
                             "raw": json.dumps({"seq": seq}), "proc_ms": ts, "wm": ts,
                             "mem": [{"i": 0, "ts": ts}, {"i": 1, "ts": ts}]})
        batches.append(rows)
    src = _write_batches(spark, batches, tmp_path)

    keyed = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(src))
    watermarked = keyed.withColumn("wm_ts", F.timestamp_millis(F.col("wm"))).withWatermark("wm_ts", "1000 milliseconds")
    stateful_in = watermarked.select(*[c for c in keyed.columns if c != "wm"],
                                     F.pmod(F.xxhash64("k"), F.lit(3)).cast("int").alias("bucket"))
    progress = _run_availably(spark, keyed_operator(stateful_in, str(versions)), tmp_path)

    sizes = [p["stateOperators"][0]["numRowsTotal"] for p in progress if p["stateOperators"]]
    one_batch = per_batch  # entries a batch's keys leave behind: one per key, both rules' sub-states in it
    assert len(sizes) >= n_batches
    assert max(sizes) >= one_batch  # a batch's keys were held...
    assert max(sizes) < 3 * one_batch + 10, sizes  # ...and never much more (4,000 keys' entries were made)
    assert any(b < a for a, b in zip(sizes, sizes[1:], strict=False)), sizes  # the store went back down
    assert max(sizes[-10:]) <= max(sizes[:10]), sizes  # flat, not growing with the keys seen


# ------------------------------------------------------------------ number arithmetic and text

# Finite doubles of every magnitude; sums of values below 1e300 cannot overflow (events
# do not hold values near 1e308).
_FLOATS = st.floats(allow_nan=False, allow_infinity=False)
_SUMMANDS = st.floats(min_value=-1e300, max_value=1e300) | st.sampled_from([0.1, 0.2, 0.3, 1e16, -1e16, 5e-324, 1.0])


def _keyed(spark):
    return spark._jvm.ruleplatform.keyed


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(x=_FLOATS)
@example(x=1e16)
@example(x=1e15)
@example(x=1e-5)
@example(x=0.0001)
@example(x=-0.0)
@example(x=5e-324)
@example(x=2.0**-1022)
@example(x=1.7976931348623157e308)
@example(x=9007199254740993.0)
def test_number_text_is_the_shortest_that_reads_back(spark, x):
    """The `mean`/`std` of a mean_std context record (docs/rule-language.md, "The
    detection record": `20.0`, `0.7071067811865476`): the shortest decimal that reads
    back as the value, ".0" on integers, an exponent outside [1e-4, 1e16). Python's
    repr writes exactly that, so it is the reference here."""
    text = _keyed(spark).JsonNumbers.shortest(x)
    assert float(text) == x and text == repr(x)


def _sum(spark, xs: list[float]) -> float:
    gateway = spark.sparkContext._gateway
    arr = gateway.new_array(gateway.jvm.double, len(xs))
    for i, x in enumerate(xs):
        arr[i] = x
    return _keyed(spark).ExactSum.of(arr, 0, len(xs))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(xs=st.lists(_SUMMANDS, max_size=40))
@example(xs=[1e16, 1.0, -1e16])
@example(xs=[0.1] * 10)
def test_sum_is_exact_then_rounded_once(spark, xs):
    """math.fsum is the exact sum rounded once: the reference."""
    assert _sum(spark, xs) == math.fsum(xs)


def test_sum_of_special_values(spark):
    inf = float("inf")
    assert _sum(spark, [1.0, inf]) == inf
    assert _sum(spark, [-inf, 2.0]) == -inf
    assert math.isnan(_sum(spark, [1.0, float("nan")]))
    with pytest.raises(Exception, match="both \\+Infinity and -Infinity"):
        _sum(spark, [inf, -inf])
    with pytest.raises(Exception, match="sum exceeds the double range"):
        _sum(spark, [1e308, 1e308])
