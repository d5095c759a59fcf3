"""Kafka for PySpark without the JVM connector: the `kafka_py` Python data source.

Spark's own Kafka connector (`spark-sql-kafka-0-10`) comes from Maven, which this
environment cannot reach, so reading and writing Kafka goes through
`pyspark.sql.datasource` on top of confluent-kafka. The contract mirrors the JVM source
so the rest of the platform does not care which one runs:

* Schema: key BINARY, value BINARY, topic STRING, partition INT, offset LONG,
  timestamp TIMESTAMP, timestampType INT (+ headers with `includeHeaders=true`).
  Values stay bytes: a record that is not valid UTF-8 or not JSON still arrives, and
  the engine dead-letters it; nothing is dropped here.
* Streaming offsets are `{"topic": {"partition": next_offset}}` (end offsets per
  topic-partition), kept in Spark's checkpoint, so a restart resumes exactly: no record
  lost, none read twice. Each micro-batch reads exactly `[start, end)` per partition,
  with partitions assigned explicitly (no consumer group).
* Options: `kafka.bootstrap.servers` (or `bootstrap`), `subscribe` (comma-separated),
  `subscribeFile` (JSON list of topics, re-read on every trigger so a running query
  picks up a new topic; a topic that does not exist yet is skipped until it does),
  `startingOffsets` (`earliest` default | `latest` | JSON with -2/-1 for earliest/latest),
  `endingOffsets` (batch only), `maxOffsetsPerTrigger`, `minPartitions`,
  `failOnDataLoss` (default true), `includeHeaders`, `kafkaConsumer.pollTimeoutMs`,
  and any other `kafka.<librdkafka property>`, passed to the consumer/producer.
* Writer (batch and streaming, same short name): columns `value` (STRING/BINARY),
  optional `key`, `topic` (or option `topic`), `partition`, `headers`. Every record is
  flushed and acknowledged before a task reports success; a delivery error fails the
  task. Like Spark's Kafka sink this is at-least-once.

`read_stream`/`read_batch`/`write_stream`/`write_batch` choose the format: `kafka_py` by
default; with `RULES_KAFKA_FORMAT=kafka` (or `auto` and the connector on the classpath,
as in the docker/ deployment) they use the JVM `kafka` format with the same schema.

All classes are at module top level: Spark pickles them by reference to its Python
workers, which import this module.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from spark_jobs.kafka.admin import SPARK_TIMESTAMP_TYPE, assign_consumer, end_offsets, probe_consumer

if TYPE_CHECKING:
    import pyarrow as pa
    from confluent_kafka import Consumer, Message
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import DataStreamWriter

log = logging.getLogger(__name__)

SHORT_NAME = "kafka_py"
JVM_FORMAT = "kafka"
FORMAT_ENV = "RULES_KAFKA_FORMAT"

KAFKA_SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
)
HEADERS_FIELD = StructField(
    "headers",
    ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
)

# Spark's Kafka source uses -2 / -1 in JSON offsets for earliest / latest.
EARLIEST, LATEST = -2, -1

Offsets = dict[tuple[str, int], int]


class DataLossError(RuntimeError):
    """Offsets the query needs are gone (retention, or a memory-only broker restarted)."""


# ----------------------------------------------------------------------------- options


def _opt(options: Mapping[str, str], *names: str, default: str | None = None) -> str | None:
    for n in names:
        if n in options and options[n] not in (None, ""):
            return str(options[n])
    return default


def _bool(value: str | None, default: bool) -> bool:
    if value is None:
        return default
    return value.strip().lower() in ("1", "true", "yes", "on")


def _passthrough(options: Mapping[str, str]) -> dict[str, str]:
    """`kafka.*` options (except bootstrap) as librdkafka properties."""
    out: dict[str, str] = {}
    for k, v in options.items():
        key = str(k).lower()
        if key.startswith("kafka.") and key != "kafka.bootstrap.servers":
            out[key[len("kafka.") :]] = str(v)
    return out


@dataclass(frozen=True)
class ReaderOptions:
    """Parsed reader options; frozen and picklable, shipped to executors with the reader."""

    bootstrap: str
    topics: tuple[str, ...] = ()
    topics_file: str | None = None
    starting_offsets: str = "earliest"
    ending_offsets: str = "latest"
    max_offsets_per_trigger: int | None = None
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    poll_timeout_s: float = 120.0
    batch_rows: int = 10_000
    consumer_conf: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReaderOptions:
        bootstrap = _opt(options, "kafka.bootstrap.servers", "bootstrap")
        if not bootstrap:
            raise ValueError("kafka_py: option 'kafka.bootstrap.servers' (or 'bootstrap') is required")
        topics = tuple(t.strip() for t in (_opt(options, "subscribe") or "").split(",") if t.strip())
        topics_file = _opt(options, "subscribeFile")
        if not topics and not topics_file:
            raise ValueError("kafka_py: set 'subscribe' (comma-separated topics) and/or 'subscribeFile'")
        if _opt(options, "assign", "subscribePattern"):
            raise ValueError("kafka_py: only 'subscribe' and 'subscribeFile' are supported")
        max_trigger = _opt(options, "maxOffsetsPerTrigger")
        min_parts = _opt(options, "minPartitions")
        if max_trigger is not None and int(max_trigger) <= 0:
            raise ValueError("kafka_py: maxOffsetsPerTrigger must be a positive number")
        return cls(
            bootstrap=bootstrap,
            topics=topics,
            topics_file=topics_file,
            starting_offsets=(_opt(options, "startingOffsets") or "earliest").strip(),
            ending_offsets=(_opt(options, "endingOffsets") or "latest").strip(),
            max_offsets_per_trigger=int(max_trigger) if max_trigger is not None else None,
            min_partitions=int(min_parts) if min_parts is not None else None,
            fail_on_data_loss=_bool(_opt(options, "failOnDataLoss"), True),
            include_headers=_bool(_opt(options, "includeHeaders"), False),
            poll_timeout_s=float(_opt(options, "kafkaConsumer.pollTimeoutMs") or 120_000) / 1000.0,
            batch_rows=int(_opt(options, "readBatchRows") or 10_000),
            consumer_conf=_passthrough(options),
        )


@dataclass(frozen=True)
class WriterOptions:
    bootstrap: str
    topic: str | None = None
    flush_timeout_s: float = 120.0
    producer_conf: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> WriterOptions:
        bootstrap = _opt(options, "kafka.bootstrap.servers", "bootstrap")
        if not bootstrap:
            raise ValueError("kafka_py: option 'kafka.bootstrap.servers' (or 'bootstrap') is required")
        return cls(
            bootstrap=bootstrap,
            topic=_opt(options, "topic"),
            flush_timeout_s=float(_opt(options, "flushTimeoutMs") or 120_000) / 1000.0,
            producer_conf=_passthrough(options),
        )


def reader_schema(include_headers: bool) -> StructType:
    return StructType([*KAFKA_SCHEMA.fields, HEADERS_FIELD]) if include_headers else KAFKA_SCHEMA


# ----------------------------------------------------------------------------- topics & offsets


def read_topics_file(path: str) -> list[str] | None:
    """Topics listed in a JSON file; None when missing or unreadable (caller decides)."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as exc:
        log.warning("kafka_py: cannot read subscribeFile %s (%s); keeping the previous topics", path, exc)
        return None
    if not isinstance(data, list) or not all(isinstance(t, str) for t in data):
        log.warning("kafka_py: subscribeFile %s must hold a JSON list of topic names; ignored", path)
        return None
    return [t.strip() for t in data if t.strip()]


def offsets_to_json(offsets: Offsets) -> dict[str, dict[str, int]]:
    """Canonical offset dict: topics sorted, partitions in numeric order.

    Spark decides whether there is new data by comparing offsets as JSON, so the same
    offsets must always serialize to the same text.
    """
    out: dict[str, dict[str, int]] = {}
    for t, p in sorted(offsets):
        out.setdefault(t, {})[str(p)] = int(offsets[(t, p)])
    return out


def offsets_from_json(data: Mapping[str, Any] | None) -> Offsets:
    out: Offsets = {}
    for t, parts in (data or {}).items():
        for p, off in (parts or {}).items():
            out[(str(t), int(p))] = int(off)
    return out


def parse_offset_spec(spec: str, option: str) -> str | Offsets:
    """'earliest' / 'latest' or a JSON offsets object."""
    low = spec.strip().lower()
    if low in ("earliest", "latest"):
        return low
    try:
        data = json.loads(spec)
    except ValueError as exc:
        raise ValueError(f"kafka_py: {option} must be 'earliest', 'latest' or JSON, got {spec!r}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"kafka_py: {option} JSON must map topic -> {{partition: offset}}")
    return offsets_from_json(data)


def resolve_offsets(spec: str | Offsets, default: str, wm: Mapping[tuple[str, int], tuple[int, int]]) -> Offsets:
    """Concrete offsets for the partitions in `wm` from a spec (-2/-1 resolved)."""
    out: Offsets = {}
    for tp, (lo, hi) in wm.items():
        if isinstance(spec, str):
            out[tp] = lo if spec == "earliest" else hi
            continue
        off = spec.get(tp, EARLIEST if default == "earliest" else LATEST)
        out[tp] = lo if off == EARLIEST else hi if off == LATEST else off
    return out


def fair_limit(begin: Offsets, end: Offsets, max_rows: int) -> Offsets:
    """Cap the total records in `[begin, end)` at `max_rows`, shared max-min fairly.

    Small partitions take all they have; the rest is split evenly among the others
    (water-filling), so one busy partition cannot starve a quiet one. Ties go by
    topic-partition order; a partition short-changed by rounding has less left next
    time and so sorts first, which keeps tiny limits from starving anyone.
    """
    avail = {tp: max(0, end[tp] - begin.get(tp, end[tp])) for tp in end}
    order = sorted(avail, key=lambda tp: (avail[tp], tp))
    remaining = max_rows
    out: Offsets = {}
    for i, tp in enumerate(order):
        share = remaining // (len(order) - i)
        take = min(avail[tp], share)
        remaining -= take
        out[tp] = begin.get(tp, end[tp]) + take
    return out


# ----------------------------------------------------------------------------- partitions & reading


class KafkaInputPartition(InputPartition):
    """One task's work: records `[start, end)` of one topic-partition."""

    def __init__(self, topic: str, partition: int, start: int, end: int) -> None:
        super().__init__((topic, partition, start, end))
        self.topic = topic
        self.partition = partition
        self.start = start
        self.end = end

    def __repr__(self) -> str:
        return f"KafkaInputPartition({self.topic}[{self.partition}] {self.start}..{self.end})"


def split_ranges(ranges: list[KafkaInputPartition], min_partitions: int | None) -> list[KafkaInputPartition]:
    """Split large offset ranges so there are at least `min_partitions` tasks."""
    if not min_partitions or len(ranges) >= min_partitions:
        return ranges
    total = sum(r.end - r.start for r in ranges)
    out: list[KafkaInputPartition] = []
    for r in ranges:
        size = r.end - r.start
        pieces = max(1, min(size, math.ceil(size * min_partitions / max(total, 1))))
        step = math.ceil(size / pieces)
        out.extend(
            KafkaInputPartition(r.topic, r.partition, s, min(s + step, r.end)) for s in range(r.start, r.end, step)
        )
    return out


# Executor-side consumer: fetches sized to the task, no group, EOF events on. A task
# reads a bounded range, so prefetching far past its end (librdkafka's default queue
# is 100k messages / 64 MB) only burns broker and client CPU on a small machine.
_READ_CONF: dict[str, object] = {
    "fetch.max.bytes": 16 * 1024 * 1024,
    "max.partition.fetch.bytes": 4 * 1024 * 1024,
    "fetch.wait.max.ms": 50,
    "fetch.queue.backoff.ms": 10,
}


def read_consumer_conf(opts: ReaderOptions, part: KafkaInputPartition) -> dict[str, object]:
    """Consumer config for one range: our tuning, then the user's `kafka.*` options."""
    size = part.end - part.start
    return {
        **_READ_CONF,
        "queued.min.messages": max(1_000, min(100_000, size)),
        **opts.consumer_conf,
        "enable.partition.eof": True,  # needed to detect the end of the log
    }


def _arrow_schema(schema: StructType) -> pa.Schema:
    """Exactly the Arrow schema Spark checks the reader's RecordBatches against."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(schema, timezone="UTC")


def messages_to_batch(msgs: Sequence[Message], topic: str, partition: int, arrow_schema: pa.Schema) -> pa.RecordBatch:
    """Kafka messages -> one RecordBatch in the source schema (list comprehensions, no per-row dicts)."""
    import pyarrow as pa

    n = len(msgs)
    stamps = [m.timestamp() for m in msgs]
    columns: dict[str, Any] = {
        "key": [m.key() for m in msgs],
        "value": [m.value() for m in msgs],
        "topic": [topic] * n,
        "partition": [partition] * n,
        "offset": [m.offset() for m in msgs],
        "timestamp": [ts * 1000 if ts_type and ts >= 0 else None for ts_type, ts in stamps],
        "timestampType": [SPARK_TIMESTAMP_TYPE.get(ts_type, -1) for ts_type, _ in stamps],
    }
    if "headers" in arrow_schema.names:
        columns["headers"] = [
            [{"key": k, "value": v} for k, v in h] if (h := m.headers()) else [] for m in msgs
        ]
    arrays = []
    for f in arrow_schema:
        if f.name == "timestamp":
            arrays.append(pa.array(columns[f.name], pa.int64()).cast(f.type))
        else:
            arrays.append(pa.array(columns[f.name], type=f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=arrow_schema)


def read_range(opts: ReaderOptions, schema: StructType, part: KafkaInputPartition) -> Iterator[pa.RecordBatch]:
    """Read exactly `[part.start, part.end)` of one partition as RecordBatches."""
    if part.end <= part.start:
        return
    arrow_schema = _arrow_schema(schema)
    consumer = assign_consumer(opts.bootstrap, read_consumer_conf(opts, part))
    try:
        pending: list[Message] = []
        for chunk in _consume_range(consumer, opts, part):
            pending.extend(chunk)
            while len(pending) >= opts.batch_rows:
                yield messages_to_batch(pending[: opts.batch_rows], part.topic, part.partition, arrow_schema)
                pending = pending[opts.batch_rows :]
        if pending:
            yield messages_to_batch(pending, part.topic, part.partition, arrow_schema)
    finally:
        consumer.close()


def _consume_range(consumer: Consumer, opts: ReaderOptions, part: KafkaInputPartition) -> Iterator[list[Message]]:
    """The messages of `[start, end)` in consumption-sized chunks.

    Asks librdkafka for exactly the records still missing, so a poll returns the moment
    the range is complete instead of waiting out its timeout for records past `end`.
    Stops at the first record at or past `end`, or at end-of-partition once `end` is
    reached (offsets can have holes: compaction, transaction markers). Reaching the end
    of the partition *before* `end`, or starting below the log start, is data loss:
    raised unless failOnDataLoss=false, because silently reading less breaks exactness.
    """
    consumer.assign([TopicPartition(part.topic, part.partition, part.start)])
    next_offset = part.start
    last_progress = time.monotonic()
    while next_offset < part.end:
        want = max(1, min(opts.batch_rows, part.end - next_offset))
        msgs = consumer.consume(num_messages=want, timeout=0.5)
        if not msgs:
            if time.monotonic() - last_progress > opts.poll_timeout_s:
                raise TimeoutError(f"kafka_py: no records from {part} for {opts.poll_timeout_s}s")
            continue
        last_progress = time.monotonic()
        good: list[Message] = []
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(err)
                if m.offset() < part.end:
                    _data_loss(opts, f"{part}: partition ends at {m.offset()}, before {part.end}")
                next_offset = part.end
                break
            off = m.offset()
            if next_offset == part.start and off > part.start:
                _check_start(consumer, opts, part)
            if off >= part.end:
                next_offset = part.end
                break
            good.append(m)
            next_offset = off + 1
        if good:
            yield good


def _check_start(consumer: Consumer, opts: ReaderOptions, part: KafkaInputPartition) -> None:
    """A first record past `start` is fine after compaction, data loss below the log start."""
    low, _ = consumer.get_watermark_offsets(TopicPartition(part.topic, part.partition), timeout=10)
    if low > part.start:
        _data_loss(opts, f"{part}: records {part.start}..{low} are gone (log starts at {low})")


def _data_loss(opts: ReaderOptions, message: str) -> None:
    if opts.fail_on_data_loss:
        raise DataLossError(f"kafka_py: data loss: {message}. Set failOnDataLoss=false to continue anyway.")
    log.warning("kafka_py: data loss (ignored, failOnDataLoss=false): %s", message)


class _KafkaMetadata:
    """Driver-side topic discovery and true end offsets, with one reusable probe consumer."""

    def __init__(self, opts: ReaderOptions) -> None:
        self.opts = opts
        self._consumer: Consumer | None = None
        self._file_topics: list[str] = []

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_consumer"] = None  # sockets do not travel; re-created lazily
        return state

    @property
    def consumer(self) -> Consumer:
        if self._consumer is None:
            self._consumer = probe_consumer(self.opts.bootstrap, self.opts.consumer_conf)
        return self._consumer

    def subscribed_topics(self) -> list[str]:
        """`subscribe` plus the current content of `subscribeFile` (last good on a bad read)."""
        if self.opts.topics_file:
            found = read_topics_file(self.opts.topics_file)
            if found is not None:
                self._file_topics = found
        return sorted(set(self.opts.topics) | set(self._file_topics))

    def partitions(self) -> list[tuple[str, int]]:
        """Existing partitions of the subscribed topics (missing topics skipped)."""
        wanted = self.subscribed_topics()
        if not wanted:
            return []
        md = self.consumer.list_topics(timeout=30)
        out: list[tuple[str, int]] = []
        for t in wanted:
            meta = md.topics.get(t)
            if meta is not None and meta.error is None:
                out.extend((t, p) for p in sorted(meta.partitions))
        return out

    def watermarks(self, tps: Iterable[tuple[str, int]]) -> dict[tuple[str, int], tuple[int, int]]:
        tps = list(tps)
        return end_offsets(self.consumer, tps, timeout=30) if tps else {}

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


# ----------------------------------------------------------------------------- readers


class KafkaBatchReader(DataSourceReader):
    """`spark.read.format("kafka_py")`: [startingOffsets, endingOffsets) at planning time."""

    def __init__(self, opts: ReaderOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self._meta = _KafkaMetadata(opts)

    def partitions(self) -> list[InputPartition]:
        try:
            wm = self._meta.watermarks(self._meta.partitions())
            start = resolve_offsets(parse_offset_spec(self.opts.starting_offsets, "startingOffsets"), "earliest", wm)
            end = resolve_offsets(parse_offset_spec(self.opts.ending_offsets, "endingOffsets"), "latest", wm)
        finally:
            self._meta.close()
        ranges = [
            KafkaInputPartition(t, p, max(start[(t, p)], wm[(t, p)][0]), min(end[(t, p)], wm[(t, p)][1]))
            for t, p in sorted(wm)
        ]
        return list(split_ranges([r for r in ranges if r.end > r.start], self.opts.min_partitions))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, KafkaInputPartition):
            return iter(())  # Spark plans one empty partition when there is nothing to read
        return read_range(self.opts, self.schema, partition)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream.format("kafka_py")`: micro-batches of exact offset ranges.

    Offsets are end offsets per topic-partition. Partitions that appear later (a new
    topic in subscribeFile, a topic created after the query started) are read from
    their earliest offset. A partition that leaves the subscription keeps its offset in
    the checkpoint, so re-adding the topic resumes instead of re-reading it.
    """

    def __init__(self, opts: ReaderOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema
        self._meta = _KafkaMetadata(opts)
        self._available: Offsets | None = None
        self._target: Offsets | None = None

    # -- offsets (driver)

    def initialOffset(self) -> dict:
        wm = self._meta.watermarks(self._meta.partitions())
        spec = parse_offset_spec(self.opts.starting_offsets, "startingOffsets")
        return offsets_to_json(resolve_offsets(spec, "earliest", wm))

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_offsets_per_trigger:
            return ReadMaxRows(self.opts.max_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        """Freeze the target: availableNow reads what exists now, in as many batches as the limit needs."""
        wm = self._meta.watermarks(self._meta.partitions())
        self._target = {tp: hi for tp, (_, hi) in wm.items()}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begin = offsets_from_json(start)
        wm = self._meta.watermarks(self._meta.partitions())
        self._available = {tp: hi for tp, (_, hi) in wm.items()}
        end: Offsets = {}
        for tp, (lo, hi) in wm.items():
            if self._target is not None and tp not in self._target:
                continue  # appeared after availableNow started: not part of this run
            cap = hi if self._target is None else min(hi, self._target[tp])
            if tp not in begin:
                if cap <= lo:
                    continue  # new partition without data yet: registered once it has some
                begin[tp] = lo  # new partition: from earliest
            elif begin[tp] > hi:
                end[tp] = self._offset_went_back(tp, begin[tp], hi, cap)
                continue
            end[tp] = max(begin[tp], cap)
        end = self._limited(begin, end, limit)
        result = offsets_from_json(start)  # keep partitions that left the subscription
        result.update(end)
        return offsets_to_json(result)

    def _offset_went_back(self, tp: tuple[str, int], begin: int, hi: int, cap: int) -> int:
        """The log looks shorter than our checkpoint: re-check once, then fail or rewind."""
        _, hi = self._meta.watermarks([tp]).get(tp, (0, hi))
        if begin <= hi:
            return max(begin, min(hi, cap))  # the first look was stale
        _data_loss(
            self.opts,
            f"{tp[0]}[{tp[1]}] ends at offset {hi} but the query already read up to {begin} "
            "(was the broker restarted with memory storage? then reset the checkpoint)",
        )
        return hi  # failOnDataLoss=false: partitions() reads [earliest, hi)

    def _limited(self, begin: Offsets, end: Offsets, limit: ReadLimit) -> Offsets:
        forward = {tp: e for tp, e in end.items() if e >= begin.get(tp, e)}
        total = sum(e - begin.get(tp, e) for tp, e in forward.items())
        if isinstance(limit, ReadMaxRows) and total > limit.max_rows:
            return {**end, **fair_limit(begin, forward, limit.max_rows)}
        if isinstance(limit, ReadMinRows) and total < limit.min_rows:
            return {}  # not enough yet: the offsets stay where they are
        return end

    def reportLatestOffset(self) -> dict | None:
        """What the broker holds (for lag in the query progress); None before the first trigger."""
        return offsets_to_json(self._available) if self._available is not None else None

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        begin = offsets_from_json(start)
        stop = offsets_from_json(end)
        missing = [tp for tp in stop if tp not in begin or begin[tp] > stop[tp]]
        lows = {tp: lo for tp, (lo, _) in self._meta.watermarks(missing).items()} if missing else {}
        ranges = []
        for tp in sorted(stop):
            s = begin.get(tp)
            if s is None or s > stop[tp]:
                s = lows.get(tp, 0)  # new partition (or rewound after data loss): earliest
            if stop[tp] > s:
                ranges.append(KafkaInputPartition(tp[0], tp[1], s, stop[tp]))
        return split_ranges(ranges, self.opts.min_partitions)

    def commit(self, end: dict) -> None:
        """Nothing to do: progress lives in Spark's checkpoint, not in a consumer group."""

    def stop(self) -> None:
        self._meta.close()

    # -- data (executors)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, KafkaInputPartition)
        return read_range(self.opts, self.schema, partition)


# ----------------------------------------------------------------------------- writers


@dataclass
class KafkaCommitMessage(WriterCommitMessage):
    """What one write task delivered: records acknowledged by the broker, per topic."""

    records: int
    per_topic: dict[str, int]


# Throughput over latency: batches of up to 1 MB, a short linger, acks from the leader's
# full ISR, and a bounded delivery time so a dead broker fails the task in a minute.
_PRODUCE_CONF: dict[str, object] = {
    "linger.ms": 10,
    "batch.size": 1_000_000,
    "batch.num.messages": 10_000,
    "queue.buffering.max.messages": 500_000,
    "acks": "all",
    "message.timeout.ms": 60_000,
}


def check_writer_schema(schema: StructType, opts: WriterOptions) -> None:
    """Fail on the driver, before any task runs, when rows cannot become records."""
    names = {f.name: f.dataType for f in schema.fields}
    text_or_bytes = (StringType, BinaryType)
    if "value" not in names:
        raise ValueError("kafka_py writer: a 'value' column (STRING or BINARY) is required")
    for col in ("value", "key"):
        if col in names and not isinstance(names[col], text_or_bytes):
            raise ValueError(f"kafka_py writer: column '{col}' must be STRING or BINARY, not {names[col].simpleString()}")
    if "topic" in names and not isinstance(names["topic"], StringType):
        raise ValueError("kafka_py writer: column 'topic' must be STRING")
    if "topic" not in names and not opts.topic:
        raise ValueError("kafka_py writer: give a 'topic' column or the 'topic' option")
    if "partition" in names and not isinstance(names["partition"], IntegerType):
        raise ValueError("kafka_py writer: column 'partition' must be INT")


def produce_batches(opts: WriterOptions, batches: Iterator[pa.RecordBatch]) -> KafkaCommitMessage:
    """Produce every row, flush, and raise if any record was not acknowledged."""
    failures: list[str] = []
    delivered = [0]

    def on_delivery(err: object, msg: Message) -> None:
        if err is not None:
            failures.append(f"{msg.topic()}: {err}")
        else:
            delivered[0] += 1

    producer = Producer({"bootstrap.servers": opts.bootstrap, **_PRODUCE_CONF, **opts.producer_conf, "on_delivery": on_delivery})
    per_topic: dict[str, int] = {}
    for batch in batches:
        _produce_batch(producer, batch, opts.topic, per_topic)
        if failures:
            break
    remaining = producer.flush(opts.flush_timeout_s)
    if failures:
        raise RuntimeError(f"kafka_py writer: {len(failures)} record(s) not delivered, first: {failures[0]}")
    if remaining:
        raise RuntimeError(f"kafka_py writer: {remaining} record(s) still unacknowledged after {opts.flush_timeout_s}s")
    total = sum(per_topic.values())
    if delivered[0] != total:
        raise RuntimeError(f"kafka_py writer: produced {total} records but {delivered[0]} were acknowledged")
    return KafkaCommitMessage(records=total, per_topic=per_topic)


def _produce_batch(producer: Any, batch: pa.RecordBatch, default_topic: str | None, per_topic: dict[str, int]) -> None:
    n = batch.num_rows
    names = batch.schema.names

    def column(name: str) -> list[Any]:
        return batch.column(names.index(name)).to_pylist() if name in names else [None] * n

    values, keys, topics = column("value"), column("key"), column("topic")
    partitions, headers = column("partition"), column("headers")
    for i in range(n):
        topic = topics[i] or default_topic
        if not topic:
            raise ValueError("kafka_py writer: a row has a null 'topic' and no 'topic' option is set")
        kwargs: dict[str, Any] = {"value": values[i], "key": keys[i]}
        if partitions[i] is not None:
            kwargs["partition"] = partitions[i]
        if headers[i]:
            kwargs["headers"] = [(h["key"], h["value"]) for h in headers[i]]
        _produce(producer, topic, kwargs)
        per_topic[topic] = per_topic.get(topic, 0) + 1
    producer.poll(0)


def _produce(producer: Any, topic: str, kwargs: dict[str, Any]) -> None:
    """produce(), waiting for queue space instead of failing when the local queue is full."""
    while True:
        try:
            producer.produce(topic, **kwargs)
            return
        except BufferError:
            producer.poll(0.05)


class KafkaBatchWriter(DataSourceArrowWriter):
    """`df.write.format("kafka_py")`: Arrow batches in, acknowledged records out."""

    def __init__(self, opts: WriterOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return produce_batches(self.opts, iterator)


class KafkaStreamWriter(DataSourceStreamArrowWriter):
    """`df.writeStream.format("kafka_py")`: at-least-once, like Spark's Kafka sink.

    A micro-batch that fails after some records were acknowledged is re-run by Spark and
    those records are produced again; downstream de-duplicates by detection_id.
    """

    def __init__(self, opts: WriterOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return produce_batches(self.opts, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Records were acknowledged in write(); nothing is left to commit."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Kafka cannot take back acknowledged records; Spark retries the batch."""


# ----------------------------------------------------------------------------- the data source


class KafkaDataSource(DataSource):
    """The `kafka_py` data source: batch + streaming reads, batch + streaming writes."""

    @classmethod
    def name(cls) -> str:
        return SHORT_NAME

    def schema(self) -> StructType:
        return reader_schema(_bool(_opt(self.options, "includeHeaders"), False))

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaBatchReader(ReaderOptions.parse(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(ReaderOptions.parse(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> KafkaBatchWriter:
        opts = WriterOptions.parse(self.options)
        check_writer_schema(schema, opts)
        return KafkaBatchWriter(opts)

    def streamWriter(self, schema: StructType, overwrite: bool) -> KafkaStreamWriter:
        opts = WriterOptions.parse(self.options)
        check_writer_schema(schema, opts)
        return KafkaStreamWriter(opts)


# ----------------------------------------------------------------------------- session helpers


_REGISTERED: set[str] = set()


def register(spark: SparkSession) -> None:
    """Register `kafka_py` with this Spark application (once; repeats are no-ops)."""
    app = _app_id(spark)
    if app not in _REGISTERED:
        spark.dataSource.register(KafkaDataSource)
        _REGISTERED.add(app)


_JVM_KAFKA: dict[str, bool] = {}


def jvm_kafka_available(spark: SparkSession) -> bool:
    """Whether the JVM `kafka` connector is on this session's classpath (checked once per app)."""
    app = _app_id(spark)
    if app not in _JVM_KAFKA:
        try:
            jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
            conf = spark._jsparkSession.sessionState().conf()  # type: ignore[attr-defined]
            jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource(JVM_FORMAT, conf)
            _JVM_KAFKA[app] = True
        except Exception:  # class not found, or Spark Connect (no JVM handle)
            _JVM_KAFKA[app] = False
    return _JVM_KAFKA[app]


def _app_id(spark: SparkSession) -> str:
    try:
        return str(spark.sparkContext.applicationId)
    except Exception:
        return str(id(spark))


def kafka_format(spark: SparkSession, fmt: str | None = None, needs_python: bool = False) -> str:
    """Which format the helpers use: `kafka_py` unless told otherwise.

    `fmt` (or env RULES_KAFKA_FORMAT): `kafka_py` (default), `kafka` (the JVM connector;
    an error if it is missing), or `auto` (JVM when on the classpath). `needs_python`
    is set when a kafka_py-only feature (subscribeFile) is asked for: `auto` then stays
    on kafka_py, `kafka` is an error.
    """
    choice = (fmt or os.environ.get(FORMAT_ENV) or SHORT_NAME).strip().lower()
    if choice == SHORT_NAME:
        register(spark)
        return SHORT_NAME
    if choice not in (JVM_FORMAT, "auto"):
        raise ValueError(f"{FORMAT_ENV} must be kafka_py, kafka or auto, not {choice!r}")
    has_jvm = jvm_kafka_available(spark)
    if choice == JVM_FORMAT and not has_jvm:
        raise RuntimeError("the JVM 'kafka' format was asked for but spark-sql-kafka is not on the classpath")
    if choice == JVM_FORMAT and needs_python:
        raise ValueError("topics_file (subscribeFile) needs kafka_py; the JVM kafka source cannot re-read it")
    if has_jvm and not needs_python:
        return JVM_FORMAT
    register(spark)
    return SHORT_NAME


def _reader_options(
    bootstrap: str,
    topics: Iterable[str] | str | None,
    topics_file: str | os.PathLike[str] | None,
    starting_offsets: str | Mapping[str, Any],
    options: Mapping[str, str] | None,
) -> dict[str, str]:
    topic_list = [topics] if isinstance(topics, str) else list(topics or [])
    opts: dict[str, str] = {"kafka.bootstrap.servers": bootstrap}
    if topic_list:
        opts["subscribe"] = ",".join(topic_list)
    if topics_file is not None:
        # Absolute: the file is re-read by Spark's source process, not by the caller.
        opts["subscribeFile"] = os.path.abspath(os.fspath(topics_file))
    opts["startingOffsets"] = starting_offsets if isinstance(starting_offsets, str) else json.dumps(starting_offsets)
    opts.update(options or {})
    return opts


def read_stream(
    spark: SparkSession,
    bootstrap: str,
    topics: Iterable[str] | str | None = None,
    topics_file: str | os.PathLike[str] | None = None,
    max_offsets_per_trigger: int | None = None,
    starting_offsets: str | Mapping[str, Any] = "earliest",
    options: Mapping[str, str] | None = None,
    fmt: str | None = None,
) -> DataFrame:
    """A streaming DataFrame in the Kafka schema over `topics` and/or a topics file."""
    name = kafka_format(spark, fmt, needs_python=topics_file is not None)
    opts = _reader_options(bootstrap, topics, topics_file, starting_offsets, options)
    if max_offsets_per_trigger:
        opts["maxOffsetsPerTrigger"] = str(int(max_offsets_per_trigger))
    return spark.readStream.format(name).options(**opts).load()


def read_batch(
    spark: SparkSession,
    bootstrap: str,
    topics: Iterable[str] | str | None = None,
    topics_file: str | os.PathLike[str] | None = None,
    starting_offsets: str | Mapping[str, Any] = "earliest",
    ending_offsets: str | Mapping[str, Any] = "latest",
    options: Mapping[str, str] | None = None,
    fmt: str | None = None,
) -> DataFrame:
    """A batch DataFrame: the records in [starting_offsets, ending_offsets) right now."""
    name = kafka_format(spark, fmt, needs_python=topics_file is not None)
    opts = _reader_options(bootstrap, topics, topics_file, starting_offsets, options)
    opts["endingOffsets"] = ending_offsets if isinstance(ending_offsets, str) else json.dumps(ending_offsets)
    return spark.read.format(name).options(**opts).load()


def write_batch(
    df: DataFrame, bootstrap: str, topic: str | None = None, options: Mapping[str, str] | None = None, fmt: str | None = None
) -> None:
    """Write a DataFrame (`value`, optional `key`/`topic`/`partition`/`headers`) to Kafka."""
    name = kafka_format(df.sparkSession, fmt)
    writer = df.write.format(name).option("kafka.bootstrap.servers", bootstrap)
    if topic:
        writer = writer.option("topic", topic)
    writer.options(**dict(options or {})).mode("append").save()


def write_stream(
    df: DataFrame, bootstrap: str, topic: str | None = None, options: Mapping[str, str] | None = None, fmt: str | None = None
) -> DataStreamWriter:
    """A configured (not started) DataStreamWriter to Kafka; the caller sets trigger/checkpoint."""
    name = kafka_format(df.sparkSession, fmt)
    writer = df.writeStream.format(name).option("kafka.bootstrap.servers", bootstrap)
    if topic:
        writer = writer.option("topic", topic)
    return writer.options(**dict(options or {}))


__all__ = [
    "KAFKA_SCHEMA",
    "SHORT_NAME",
    "DataLossError",
    "KafkaBatchReader",
    "KafkaBatchWriter",
    "KafkaCommitMessage",
    "KafkaDataSource",
    "KafkaInputPartition",
    "KafkaStreamReader",
    "KafkaStreamWriter",
    "ReaderOptions",
    "WriterOptions",
    "fair_limit",
    "jvm_kafka_available",
    "kafka_format",
    "read_batch",
    "read_stream",
    "register",
    "write_batch",
    "write_stream",
]
