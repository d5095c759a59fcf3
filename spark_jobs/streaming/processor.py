"""The stateful processor of the live job: transformWithStateInPandas keyed by (key group, bucket).

A key group is every keyed rule (velocity, correlation) with the same key expression
(compiled.key_group: the JSON path of its grouping/correlation key). The operator gets
one row per (event, key group), not per (event, rule): the key, the event once, and in
`m` the indexes of the group's rule rows the event enters ("0,3,7"), each index naming
a `Slot` (which rule, in which role, and which columns hold its time and value). With
one row per (event, rule) the operator's per-row cost (pyspark's row input path,
regrouping, the event's text on every row) was what held the job down: 7.7 rows per
event for the benchmark's rules. The rules are read by reference once per process (the
slots name them; nothing of a rule travels with the rows), and each rule keeps its own
sub-state per key, evaluated by the same per-rule logic as before.

A bucket is `pmod(xxhash64(key), N)` of the key (job.py), so one Python call serves
every key of a group that falls in that bucket. The bucket's state is one value in
Spark's state store (RocksDB), checkpointed with the query: its timer and, per key and
rule id, the rule version/signature, the last crossing flag, the newest event time, the
sub-state's expiry and its velocity window or correlation buffers. This is a new state
layout: checkpoints of the (rule_id, bucket) processor cannot be resumed (start the job
with a fresh checkpoint).

Why one value per bucket and not a MapState entry per key: every state call is a
round trip to the JVM's state server, and pyspark's MapState has no batched get or
update. One get and one update per key and batch took most of the operator's time
(about 85% at 20k events per batch); it is now two calls per (key group, bucket)
and batch, whatever the number of keys and rules. The price: a batch rewrites
the whole bucket, also its keys without new events; at the rates where that would
matter, nearly every key has new events in every batch anyway.

Why pandas and bytes: with the Row API (transformWithState) pyspark builds every input
Row cell by cell from Arrow, which took more time than everything else together. The
pandas API hands over column batches, read here into plain tuples once; the output goes
back as one Arrow-backed DataFrame per call (`_frame`). Likewise decoding, not the
logic, was the cost of state: a key's window and buffers are stored as the raw bytes of
their columns (int64 times, float64 values, texts joined by NUL), not as JSON text of
lists, so a window of 1000 events loads in microseconds instead of a millisecond. This
layout is a new state schema: checkpoints written by the Row-based processor cannot be
resumed (start the job with a fresh checkpoint).

Expiry: each (key, rule) sub-state has its own expiry time (its newest event a full
window, plus the allowed lateness, behind); it is forgotten once the watermark reaches
it, exactly as a per-(rule, key) event-time timer would forget it. The bucket keeps one
event-time timer at (or before) the earliest expiry of its sub-states; it is moved only
when one needs an earlier one, and when it fires the expired sub-states (and keys left
with none) are removed and the timer re-set for the next.

Rows older than the job watermark are not dropped silently: they come out as dead
letters ("late"). That is why the watermark is read here from the timer values instead
of being enforced by Spark on the operator's input.

The same operator exists in the JVM (jvm_operator.py, spark_jobs/jvm/processor: the job's
`keyed_operator` setting picks one): a change of semantics here or in keyed_logic.py must
be made there too; tests/integration/test_jvm_keyed_operator.py holds the two equal.
"""

from __future__ import annotations

import json
import pickle
import struct
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark.sql.streaming import StatefulProcessor, StatefulProcessorHandle
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DoubleType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs.engine.conditions import compare_json
from spark_jobs.rules.model import AnyRule, CorrelationRule, VelocityRule, parse_rule
from spark_jobs.streaming.keyed_logic import (
    CorrelationState,
    Emit,
    Row,
    VelocityState,
    correlation_step,
    evict_context,
    evict_window,
    velocity_step,
)
from spark_jobs.streaming.rules_source import rule_def_path

# One key's state, a tuple of these fields (inside the bucket's pickled value, not a
# Spark schema): rule version and signature (str), last crossing flag (bool), newest
# event time and expiry (int, ms), and bytes. A velocity window is columns of bytes,
# sorted by time (`t`: int64 times, `n`: float64 values with NaN for none, `j`: the
# values' JSON text, see `_dump_texts`), only those its aggregation reads; all None when
# the window is empty. The correlation buffers (context records, held primaries) are
# rows in columns of bytes too (`_dump_rows`).
KEY_STATE_FIELDS = ("version", "signature", "prev_above", "max_ts", "expiry", "t", "n", "j", "context", "pending")
VERSION, SIGNATURE, PREV_ABOVE, MAX_TS, EXPIRY, T, N, J, CONTEXT, PENDING = range(len(KEY_STATE_FIELDS))
# A bucket's whole state, read and written once per micro-batch: its timer and its
# keys, {key: {rule_id: tuple of KEY_STATE_FIELDS}} pickled (builtins only: str, int,
# bool, bytes, None). See the module docstring for why not a MapState.
BUCKET_SCHEMA = StructType([StructField("timer", LongType()), StructField("keys", BinaryType())])

OUTPUT_SCHEMA = StructType([
    StructField("kind", StringType()),  # detection | routed | dead
    StructField("rule_id", StringType()),
    StructField("rule_version", StringType()),
    StructField("rule_type", StringType()),
    StructField("rule_name", StringType()),
    StructField("topic", StringType()),
    StructField("seq", LongType()),
    StructField("ts_ms", LongType()),
    StructField("raw", StringType()),
    StructField("agg_type", StringType()),
    StructField("agg_value", DoubleType()),
    StructField("metric", StringType()),
    StructField("emit_context", BooleanType()),
    StructField("ctx_num", DoubleType()),
    StructField("ctx_json", StringType()),
    StructField("metric_value", DoubleType()),
    StructField("ctx_record", StringType()),
    StructField("reason", StringType()),
])
OUTPUT_COLUMNS = [f.name for f in OUTPUT_SCHEMA.fields]

# Velocity emits bound for correlation rules (`emit_to_sink: false`) never leave the job
# (docs/rule-language.md, "Routing"): a second operator, chained behind this one in every plan (job.py
# `build`), judges them in the same micro-batch. Spark chains a stateful operator behind
# another only when the first stamps each output row with an event time
# (eventTimeColumnName) that is not behind its watermark: `et`, the row's own time or the
# watermark + 1 ms, whichever is later (only for Spark; the row's time stays in ts_ms).
CHAINED_SCHEMA = StructType([*OUTPUT_SCHEMA.fields, StructField("et", TimestampType())])
# The operators' groups of rows that only pass through them: each event's threshold
# matches, dead letters and (for the second operator's correlation rules) context
# records, then the first operator's own detections and dead letters. The plan is one
# line from its one scan of the input to the sink, because Spark plans a DataFrame
# that feeds two branches of a streaming query once per branch: a second scan and
# parse of the input, or a stateful operator twice, each copy with a state of its own.
# No rule's key group is this (key groups are JSON paths).
PASS_GID = "\u0000pass"

_RULES: dict[tuple[str, str], tuple[AnyRule, str]] = {}
_BY_REF: dict[str, tuple[AnyRule, str]] = {}


def _rule_by_ref(defs_dir: str, ref: str) -> tuple[AnyRule, str]:
    """The rule a row names by reference (rules_source.RULE_DEFS), read once per process."""
    hit = _BY_REF.get(ref)
    if hit is None:
        if len(_BY_REF) > 10_000:
            _BY_REF.clear()
        hit = _BY_REF[ref] = _rule(rule_def_path(defs_dir, ref).read_text())
    return hit


def _rule(rule_json: str) -> tuple[AnyRule, str]:
    """The rule of a row and its state signature, parsed once per distinct rule text."""
    data = json.loads(rule_json)
    key = (data["rule_id"], rule_json)
    hit = _RULES.get(key)
    if hit is None:
        if len(_RULES) > 10_000:
            _RULES.clear()
        rule = parse_rule(data)
        hit = _RULES[key] = (rule, _signature(rule))
    return hit


def _signature(rule: AnyRule) -> str:
    """What a window or context buffer depends on; a version that changes it resets state.

    A new threshold or emit mode keeps the window (it applies from the next event);
    new conditions, grouping or value fields mean old entries no longer qualify.
    """
    d = rule.model_dump(mode="json")
    keep = ("source_topic", "conditions", "group_by", "aggregation_field", "aggregation_type", "time_mode",
            "timestamp_field", "context_topic", "correlation_key", "context_value_field", "context_type_field",
            "context_type_value", "event_value_field")
    return json.dumps({k: d.get(k) for k in keep}, sort_keys=True)


# -- input: pandas column batches -> plain tuples ----------------------------------------


class Slot(NamedTuple):
    """One keyed rule row of the plan, named by its index in an input row's `m`: the
    rule (by `rule_ref` in the job's defs_dir, or whole as `rule_json` where tests and
    tools build rows by hand), its role, and the columns its time and value are in."""

    rule_ref: str | None
    rule_json: str | None
    role: str  # source | context | routed
    event_time: bool
    ts_col: str  # epoch ms (proc_ms: processing time)
    far_col: str | None  # why the time is unusable (NULL: it is usable)
    num_col: str | None
    jv_col: str | None


def slot_rule(slot: Slot, defs_dir: str | None) -> tuple[AnyRule, str]:
    """The rule a slot names and its state signature: read by reference from `defs_dir`
    (the job), or given whole (tests, tools). Shared by both keyed operators."""
    if slot.rule_ref is not None and defs_dir is not None:
        return _rule_by_ref(defs_dir, slot.rule_ref)
    if slot.rule_json is None:
        raise ValueError(f"slot {slot} names its rule by reference and the processor has no defs_dir")
    return _rule(slot.rule_json)


# The columns of every input row: the key group and bucket (the grouping), the key,
# the slot indexes and the event.
ROW_COLUMNS = (("k", "obj"), ("m", "obj"), ("topic", "obj"), ("seq", "int"), ("raw", "obj"), ("proc_ms", "int"))

# One (event, rule row) as a tuple, in this order (what the per-rule logic reads).
_IN = ("role", "event_time", "ts_ms", "seq", "topic", "raw", "num", "jv", "k", "ts_issue")
ROLE, EVENT_TIME, TS, SEQ, TOPIC, RAW, NUM, JV, KEY, TS_ISSUE = range(len(_IN))
# Value columns (compiled.key_rows): t<i> epoch ms, a<i> a time's issue, n<i> number, j<i> JSON text.
_COL_KIND = {"t": "int", "a": "obj", "n": "float", "j": "obj"}


def _kind(col: str) -> str:
    fixed = dict(ROW_COLUMNS).get(col)
    if fixed is not None:
        return fixed
    return _COL_KIND[col[0]] if col[1:].isdigit() else "obj"


def _missing(v: Any) -> bool:
    return v is None or v is pd.NA or (isinstance(v, float) and v != v)


def _column(s: pd.Series, kind: str) -> list:
    """A column as Python values, None where Spark had null.

    pandas turns a null into NaN in a float column, and a long column with a null in
    its Arrow batch arrives as float64 (or Int64 with pd.NA under
    preferIntExtensionDtype); what Spark sent was a null or an integer. (A NaN value
    and a null cannot be told apart in a float column; the job's values are never NaN.)
    """
    values = s.tolist()
    if isinstance(s.dtype, np.dtype) and s.dtype.kind in "biu":  # numpy bool and integer columns hold no nulls
        return values
    if kind == "int":
        return [None if _missing(v) else int(v) for v in values]
    if not s.hasnans:
        return values
    if kind == "float":
        return [None if _missing(v) else float(v) for v in values]
    return [None if _missing(v) else v for v in values]


def _to_row(r: tuple) -> Row:
    return Row(ts=r[TS], seq=r[SEQ], num=r[NUM], jv=r[JV], raw=r[RAW], topic=r[TOPIC])


# -- output: tuples in OUTPUT_SCHEMA's order -> one pandas DataFrame ----------------------

_ARROW = {StringType(): pa.string(), LongType(): pa.int64(), DoubleType(): pa.float64(), BooleanType(): pa.bool_()}
_OUT_TYPES = [_ARROW[f.dataType] for f in OUTPUT_SCHEMA.fields]


def _out(kind: str, rule: AnyRule, row: Row, emit: Emit | None = None, reason: str | None = None) -> tuple:
    return (
        kind, rule.rule_id, rule.version, rule.rule_type, rule.name,
        row.topic, row.seq, row.ts, row.raw,
        rule.aggregation_type if isinstance(rule, VelocityRule) else None,
        emit.agg_value if emit else None,
        rule.metric if isinstance(rule, CorrelationRule) else None,
        rule.emit_mode in ("context", "both") if isinstance(rule, CorrelationRule) else None,
        emit.ctx_num if emit else None,
        emit.ctx_json if emit else None,
        emit.metric_value if emit else None,
        emit.ctx_record if emit else None,
        reason,
    )


_ET_TYPE = pa.timestamp("us", tz="UTC")


def _frame(rows: list[tuple], types: list[pa.DataType] = _OUT_TYPES) -> pd.DataFrame:
    """Output rows as one DataFrame, columns in OUTPUT_SCHEMA's order.

    pyspark turns each returned DataFrame into Arrow column by column, a fixed cost
    per column and call that outweighed the rows themselves. Columns that are Arrow
    arrays already (pd.ArrowDtype) convert without a copy or a null scan, and None is
    null in them whatever the type (no NaN in a double column, no float64 long column).
    Labels are positions, not names: pyspark would reorder a frame with named columns
    by a take per call.
    """
    return pd.DataFrame(
        {i: pd.array(pa.array(col, type=t), dtype=pd.ArrowDtype(t))
         for i, (col, t) in enumerate(zip(zip(*rows, strict=True), types, strict=True))},
        copy=False,
    )


# -- the stored form of a key's entries --------------------------------------------------

# A list of texts: joined by NUL (JSON text never holds a raw NUL); nothing when all
# are None; JSON otherwise (a None among texts, or a NUL in one). The first byte tells which.
_SEP = "\x00"


def _dump_texts(xs: list[str | None]) -> bytes:
    if None not in xs:
        s = _SEP.join(xs)  # type: ignore[arg-type]
        if s.count(_SEP) == len(xs) - 1:
            return b"\x00" + s.encode()
    elif xs.count(None) == len(xs):
        return b"\x02"
    return b"\x01" + json.dumps(xs, separators=(",", ":")).encode()


def _load_texts(b: bytes, n: int) -> list[str | None]:
    if b[0] == 0:
        return b[1:].decode().split(_SEP)
    if b[0] == 2:
        return [None] * n
    return json.loads(b[1:])


def _dump_window(state: VelocityState, kind: str) -> tuple[bytes | None, bytes | None, bytes | None]:
    """(t, n, j): only what the aggregation reads (no event text, no seq)."""
    if not state.ts:
        return None, None, None
    t = np.array(state.ts, "<i8").tobytes()
    if kind == "count":
        return t, None, None
    if kind == "distinct_count":
        return t, None, _dump_texts(state.jv)
    return t, np.array(state.num, "<f8").tobytes(), None


def _load_window(t: bytes | None, n: bytes | None, j: bytes | None, prev_above: bool | None) -> VelocityState:
    if not t:
        return VelocityState(prev_above=prev_above)
    ts = np.frombuffer(t, "<i8").tolist()
    num = np.frombuffer(n, "<f8").tolist() if n else [float("nan")] * len(ts)
    jv = _load_texts(j, len(ts)) if j else [None] * len(ts)
    return VelocityState(ts, num, jv, prev_above)


# Correlation buffers: a header (format, rows, byte lengths of the three text sections),
# ts and seq as int64, num as float64 (NaN: none), then jv, raw and topic as texts. A
# row without ts or seq (never stored by this processor) falls back to JSON rows.
_ROWS_HEAD = struct.Struct("<BIIII")


def _dump_rows(rows: list[Row]) -> bytes | None:
    if not rows:
        return None
    if any(e.ts is None or e.seq is None for e in rows):
        return b"\x01" + json.dumps([[e.ts, e.seq, e.num, e.jv, e.raw or None, e.topic or None] for e in rows],
                                    separators=(",", ":")).encode()
    jv = _dump_texts([e.jv for e in rows])
    raw = _dump_texts([e.raw or "" for e in rows])  # as before: an empty or missing text loads as ""
    topic = _dump_texts([e.topic or "" for e in rows])
    return b"".join((
        _ROWS_HEAD.pack(0, len(rows), len(jv), len(raw), len(topic)),
        np.array([e.ts for e in rows], "<i8").tobytes(),
        np.array([e.seq for e in rows], "<i8").tobytes(),
        np.array([np.nan if e.num is None else e.num for e in rows], "<f8").tobytes(),
        jv, raw, topic,
    ))


def _load_rows(b: bytes | None) -> list[Row]:
    if not b:
        return []
    if b[0] == 1:
        return [Row(t[0], t[1], t[2], t[3], t[4] or "", t[5] or "") for t in json.loads(b[1:])]
    _, n, lj, lr, lt = _ROWS_HEAD.unpack_from(b)
    o = _ROWS_HEAD.size
    ts = np.frombuffer(b, "<i8", n, o).tolist()
    seq = np.frombuffer(b, "<i8", n, o + 8 * n).tolist()
    a = np.frombuffer(b, "<f8", n, o + 16 * n)
    num = [None if x != x else x for x in a.tolist()] if bool(np.isnan(a).any()) else a.tolist()
    o += 24 * n
    jv = _load_texts(b[o:o + lj], n)
    raw = _load_texts(b[o + lj:o + lj + lr], n)
    topic = _load_texts(b[o + lj + lr:o + lj + lr + lt], n)
    return list(map(Row, ts, seq, num, jv, raw, topic))


def _forget_idle_processing_time_keys(rule: VelocityRule, keys: dict[str, dict[str, tuple]],
                                     batch: dict[str, list[tuple]]) -> bool:
    """Drop the sub-states of a processing-time rule whose window is empty by now.

    Processing time has no watermark and the operator's timers are event-time ones, so
    these are swept whenever the rule has rows in their bucket: `now` is the newest
    broker time of the rule's rows in the batch, and a key whose newest entry is a
    whole window older holds nothing any later event can see. (As with event-time
    expiry, a key forgotten this way has no "previous event" for `last_event` when it
    comes back.) Returns whether any was dropped.
    """
    times = [r[TS] for rows in batch.values() for r in rows if r[TS] is not None]
    if not times:
        return False
    horizon = max(times) - rule.window_ms
    rid = rule.rule_id
    idle = [k for k, subs in keys.items()
            if k not in batch and (v := subs.get(rid)) is not None and v[MAX_TS] is not None and v[MAX_TS] <= horizon]
    for k in idle:
        subs = keys[k]
        del subs[rid]
        if not subs:
            del keys[k]
    return bool(idle)


class DetectionProcessor(StatefulProcessor):
    """One instance per task; `handleInputRows` runs per (key group, bucket) of a batch.

    `slots` are the plan's keyed rule rows (compiled.key_rows), indexed by the rows'
    `m`; a slot's rule is read from `defs_dir` by its `rule_ref` (the job), or given
    whole as its `rule_json`.
    """

    def __init__(self, slots: Sequence[Slot], defs_dir: str | None = None, chained: bool = False,
                 passes: bool = False) -> None:
        """`chained`: a second operator follows, so the output is CHAINED_SCHEMA; `passes`:
        the rows of the PASS_GID groups (OUTPUT_SCHEMA's columns among the input's: the
        events' threshold matches, dead letters and context records, then the first
        operator's own output) are handed on as they came."""
        self.slots = list(slots)
        self.defs_dir = defs_dir
        self.chained = chained
        self.passes = passes

    def init(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.bucket = handle.getValueState("bucket", BUCKET_SCHEMA)

    # -- the bucket: its timer and its keys' state, one read and one write ---------------
    def _load(self) -> tuple[int | None, dict[str, dict[str, tuple]]]:
        v = self.bucket.get()  # None when absent: no exists() round trip
        if v is None:
            return None, {}
        return v[0], pickle.loads(v[1]) if v[1] else {}

    def _store(self, timer: int | None, keys: dict[str, dict[str, tuple]]) -> None:
        if not keys and timer is None:
            self.bucket.clear()
        else:
            self.bucket.update((timer, pickle.dumps(keys, protocol=pickle.HIGHEST_PROTOCOL)))

    def _rows_by_rule(self, frames: Iterator[pd.DataFrame]) -> dict[str, tuple[AnyRule, str, dict[str, list[tuple]]]]:
        """The batch's rows of this group as (event, rule row) tuples (`_IN`), by rule id
        and key, in arrival order."""
        by_rule: dict[str, tuple[AnyRule, str, dict[str, list[tuple]]]] = {}
        # Per slot index of `m`: (slot, that rule's rows by key); rules resolved once per call.
        seen: dict[str, tuple[Slot, dict[str, list[tuple]]]] = {}
        for pdf in frames:  # more than one when the group outgrows an Arrow batch
            n = len(pdf)
            if n == 0:
                continue
            cols: dict[str, list] = {}

            def col(name: str | None, pdf: pd.DataFrame = pdf, n: int = n, cols: dict[str, list] = cols) -> list:
                if name is None:
                    return [None] * n
                got = cols.get(name)
                if got is None:
                    got = cols[name] = _column(pdf[name], _kind(name)) if name in pdf else [None] * n
                return got

            ks, ms, topics, seqs, raws = col("k"), col("m"), col("topic"), col("seq"), col("raw")
            per_slot: dict[str, tuple] = {}
            for i, m in enumerate(ms):
                for idx in m.split(","):
                    hit = seen.get(idx)
                    if hit is None:
                        slot = self.slots[int(idx)]
                        rule, sig = slot_rule(slot, self.defs_dir)
                        entry = by_rule.get(rule.rule_id)
                        if entry is None:
                            entry = by_rule[rule.rule_id] = (rule, sig, {})
                        hit = seen[idx] = (slot, entry[2])
                    slot, per_key = hit
                    cs = per_slot.get(idx)
                    if cs is None:
                        cs = per_slot[idx] = (col(slot.ts_col), col(slot.far_col), col(slot.num_col), col(slot.jv_col))
                    ts, issue = cs[0][i], cs[1][i]
                    if issue is not None:
                        ts = None
                    k = ks[i]
                    r = (slot.role, slot.event_time, ts, seqs[i], topics[i], raws[i], cs[2][i], cs[3][i], k, issue)
                    group = per_key.get(k)
                    if group is None:
                        per_key[k] = [r]
                    else:
                        group.append(r)
        return by_rule

    # -- the API -------------------------------------------------------------------------
    def handleInputRows(self, key: Any, rows: Iterator[pd.DataFrame], timerValues: Any) -> Iterator[pd.DataFrame]:
        if self.passes and key[0] == PASS_GID:
            floor = timerValues.getCurrentWatermarkInMs() + 1
            for pdf in rows:  # column batches in, the same out: no row is looked at in Python
                if len(pdf):
                    out = pdf[OUTPUT_COLUMNS]
                    if self.chained:  # `et` as _frame stamps it: ts_ms, or the watermark + 1 ms
                        ts = pd.to_numeric(out["ts_ms"]).fillna(0).clip(lower=floor).astype("int64")
                        out = out.assign(et=pd.to_datetime(ts, unit="ms", utc=True))
                    out.columns = range(len(out.columns))
                    yield out
            return
        by_rule = self._rows_by_rule(rows)
        if not by_rule:
            return
        watermark = timerValues.getCurrentWatermarkInMs()
        timer, keys = self._load()
        out: list[tuple] = []
        earliest: int | None = None
        changed = False
        for rid, (rule, sig, by_key) in by_rule.items():
            for k, key_rows in by_key.items():
                key_out: list[tuple] = []
                subs = keys.get(k)
                try:
                    stored = self._key(rule, sig, k, key_rows, watermark, key_out, subs.get(rid) if subs else None)
                except Exception as exc:  # noqa: BLE001 - one key's failure must not fail the batch
                    # The key's rows become dead letters with the error and its state stays as
                    # it was; the batch, every other key and rule and the job go on. Failing
                    # the batch would fail it again on every restart: the same rows come back.
                    reason = f"rule evaluation failed: {type(exc).__name__}: {str(exc)[:300]}"
                    out.extend(_out("dead", rule, _to_row(r), reason=reason) for r in key_rows)
                    continue
                out.extend(key_out)
                if stored is None:
                    continue
                if subs is None:
                    subs = keys[k] = {}
                subs[rid] = stored
                changed = True
                expiry = stored[EXPIRY]
                if expiry is not None and (earliest is None or expiry < earliest):
                    earliest = expiry
            if isinstance(rule, VelocityRule) and not rule.uses_event_time:
                changed |= _forget_idle_processing_time_keys(rule, keys, by_key)
        # Sub-states not in this batch keep expiries at or after the registered timer; it
        # only has to move when one of this batch needs an earlier one. Spark refuses a
        # timer at or before the watermark (an event far in the past, with the watermark
        # still at 0, has such an expiry): it fires at the next watermark move instead.
        if earliest is not None:
            earliest = max(earliest, watermark + 1)
        if earliest is not None and (timer is None or earliest < timer):
            if timer is not None:
                self.handle.deleteTimer(timer)
            self.handle.registerTimer(earliest)
            timer = earliest
            changed = True
        if changed:
            self._store(timer, keys)
        if out and self.chained:
            floor = watermark + 1
            yield _frame([(*o, 1000 * max(o[7] or 0, floor)) for o in out], [*_OUT_TYPES, _ET_TYPE])
        elif out:
            yield _frame(out)

    def _key(self, rule: AnyRule, sig: str, k: str, rows: list[tuple], watermark: int, out: list[tuple],
             v: tuple | None) -> tuple | None:
        """One key's rows of the batch, `v` its stored state: its outputs appended to
        `out`; returns its new state (None: untouched)."""
        fresh: list[tuple] = []
        for r in rows:
            if r[TS] is None:
                # An event-time rule and no usable timestamp: the row never touches state.
                out.append(_out("dead", rule, _to_row(r),
                                reason=r[TS_ISSUE] or f"missing or unparseable timestamp needed by {rule.rule_type} rule"))
            # Routed primaries were judged for lateness when they entered the velocity
            # rule; re-injected a batch later, they must not be late a second time.
            elif r[EVENT_TIME] and r[ROLE] != "routed" and watermark > 0 and r[TS] < watermark:
                out.append(_out("dead", rule, _to_row(r),
                                reason=f"late event: older than the job watermark ({watermark} ms)"))
            else:
                fresh.append(r)
        if all(r[TS] is None for r in rows):
            return None
        fresh.sort(key=lambda r: (r[TS], r[SEQ]))

        stored: list[Any] = [None] * len(KEY_STATE_FIELDS) if v is None else list(v)
        if stored[SIGNATURE] is not None and stored[SIGNATURE] != sig:
            stored[T] = stored[N] = stored[J] = stored[CONTEXT] = stored[PENDING] = None
            stored[PREV_ABOVE] = None

        if isinstance(rule, VelocityRule):
            self._velocity(rule, fresh, stored, watermark, out)
        elif isinstance(rule, CorrelationRule):
            self._correlation(rule, fresh, stored, watermark, out)
        stored[VERSION], stored[SIGNATURE] = rule.version, sig
        return tuple(stored)

    def _velocity(self, rule: VelocityRule, rows: list[tuple], stored: list[Any], watermark: int,
                  out: list[tuple]) -> None:
        state = _load_window(stored[T], stored[N], stored[J], stored[PREV_ABOVE])
        new = [_to_row(r) for r in rows]
        emits = velocity_step(rule, state, new)
        if new:
            stored[MAX_TS] = max(stored[MAX_TS] or new[-1].ts, max(r.ts for r in new))
        horizon = stored[MAX_TS] or 0
        if rule.uses_event_time and watermark > 0:
            horizon = min(horizon, watermark)
        evict_window(state, rule, horizon)
        stored[PREV_ABOVE] = state.prev_above
        if rule.uses_event_time and stored[MAX_TS] is not None:
            stored[EXPIRY] = stored[MAX_TS] + rule.window_ms + int(rule.watermark_delay * 1000)
        kind = "detection" if rule.emit_to_sink else "routed"
        out.extend(_out(kind, rule, e.row, e) for e in emits)
        stored[T], stored[N], stored[J] = _dump_window(state, rule.aggregation_type)

    def _correlation(self, rule: CorrelationRule, rows: list[tuple], stored: list[Any], watermark: int,
                     out: list[tuple]) -> None:
        state = CorrelationState(_load_rows(stored[CONTEXT]), _load_rows(stored[PENDING]))
        primaries = [_to_row(r) for r in rows if r[ROLE] != "context"]
        contexts = [_to_row(r) for r in rows if r[ROLE] == "context"]
        op, value = rule.condition.operator, rule.condition.value
        emits = correlation_step(rule, state, primaries, contexts, watermark, lambda jv: compare_json(jv, op, value))
        ts_all = [r.ts for r in primaries + contexts]
        if ts_all:
            stored[MAX_TS] = max([stored[MAX_TS] or ts_all[0], *ts_all])
        if watermark > 0:
            evict_context(state, rule, watermark)
        if stored[MAX_TS] is not None:
            stored[EXPIRY] = stored[MAX_TS] + rule.lookback_ms + int(rule.watermark_delay * 1000)
        out.extend(_out("detection", rule, e.row, e) for e in emits)
        stored[CONTEXT], stored[PENDING] = _dump_rows(state.context), _dump_rows(state.pending)

    def handleExpiredTimer(self, key: Any, timerValues: Any, expiredTimerInfo: Any) -> Iterator[pd.DataFrame]:
        """Forget the (key, rule) sub-states whose newest event is a full window (plus the
        allowed lateness) behind the watermark: those whose own timer would have fired
        (expiry <= watermark, Spark's rule for event-time timers), and keys left with
        none. Then re-arm for the next."""
        watermark = timerValues.getCurrentWatermarkInMs()
        _, keys = self._load()
        earliest: int | None = None
        kept: dict[str, dict[str, tuple]] = {}
        for k, subs in keys.items():
            live: dict[str, tuple] = {}
            for rid, v in subs.items():
                expiry = v[EXPIRY]
                if expiry is not None and expiry <= watermark:
                    continue
                live[rid] = v
                if expiry is not None and (earliest is None or expiry < earliest):
                    earliest = expiry
            if live:
                kept[k] = live
        # Spark deletes the fired timer after this returns; `earliest` > watermark >= it.
        if earliest is not None:
            self.handle.registerTimer(earliest)
        self._store(earliest, kept)
        return iter(())

    def close(self) -> None:
        pass
