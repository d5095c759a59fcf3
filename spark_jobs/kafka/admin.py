"""Small helpers over confluent-kafka's AdminClient and Consumer for the control plane.

The data plane (the live job's input and output, topic replays in a backtest) is Spark's
own Kafka connector. What is here serves the driver-side and command-line pieces: topic
creation with the platform's configs, reading a small topic to its end (the rule set,
a test's output), tailing. Readers assign partitions explicitly and never join a group:
a reader that knows exactly which offsets it wants does not need one.

Every helper takes the `role` its caller plays (a principal of spark_jobs/kafka/security.py);
`spark_jobs.kafka.client_config` turns it into credentials when the platform runs with
SASL/SCRAM, and into nothing on a plaintext broker.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from spark_jobs.kafka.client_config import with_bootstrap

_QUIET = logging.getLogger("spark_jobs.kafka.admin.probe")
_QUIET.addHandler(logging.NullHandler())
_QUIET.propagate = False

# librdkafka timestamp types -> Spark's `timestampType` column (Kafka's TimestampType ids).
SPARK_TIMESTAMP_TYPE = {0: -1, 1: 0, 2: 1}


@dataclass(frozen=True)
class TopicSpec:
    """How to create one topic: partition count and topic configs (e.g. cleanup.policy).

    `replication` -1 takes the broker's `default.replication.factor`, so a topic created
    by any client (the job's sink, a test's input) on a three-broker cluster gets three
    replicas without every caller knowing the cluster's size.
    """

    partitions: int = 1
    config: Mapping[str, str] = field(default_factory=dict)
    replication: int = -1


@dataclass(frozen=True)
class KafkaRecord:
    """One record as stored on the broker; value/key stay bytes (None for null)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    timestamp_type: int
    headers: tuple[tuple[str, bytes | None], ...] = ()

    def header(self, name: str) -> bytes | None:
        """The last header called `name`, or None."""
        found = None
        for k, v in self.headers:
            if k == name:
                found = v
        return found


def admin_client(bootstrap: str, extra: Mapping[str, object] | None = None, role: str | None = None) -> AdminClient:
    return AdminClient(with_bootstrap(bootstrap, role, extra))


def assign_consumer(bootstrap: str, extra: Mapping[str, object] | None = None, role: str | None = None) -> Consumer:
    """A consumer meant for `assign()` only: no group offsets are committed or read.

    librdkafka still wants a group.id; a random one keeps readers from ever sharing
    (and rebalancing) a group by accident.
    """
    conf: dict[str, object] = {
        **with_bootstrap(bootstrap, role),
        "group.id": f"rules-platform-assign-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
    }
    conf.update(extra or {})
    return Consumer(conf)


def list_topics(bootstrap: str, timeout: float = 10.0, role: str | None = None,
                extra: Mapping[str, object] | None = None) -> dict[str, list[int]]:
    """topic -> sorted partition ids, for every topic the broker knows (internal ones
    skipped; under ACLs: every topic `role` may describe)."""
    md = admin_client(bootstrap, extra, role).list_topics(timeout=timeout)
    return {
        name: sorted(t.partitions)
        for name, t in md.topics.items()
        if t.error is None and not name.startswith("__")
    }


def topic_partitions(bootstrap: str, topic: str, timeout: float = 10.0, role: str | None = None,
                     extra: Mapping[str, object] | None = None) -> list[int]:
    """Partition ids of `topic`; empty when the topic does not exist (yet)."""
    return list_topics(bootstrap, timeout, role, extra).get(topic, [])


def create_topics(
    bootstrap: str,
    topics: Mapping[str, TopicSpec] | Iterable[str],
    timeout: float = 15.0,
    extra: Mapping[str, object] | None = None,
    role: str | None = None,
) -> list[str]:
    """Create the topics that do not exist yet; returns the names actually created.

    Idempotent: an existing topic is left as it is (its partition count is not changed).
    A topic config the broker rejects is dropped and the topic created without it,
    because a missing `cleanup.policy=compact` degrades retention, while a missing
    topic stops the platform.
    """
    specs = dict(topics) if isinstance(topics, Mapping) else {t: TopicSpec() for t in topics}
    admin = admin_client(bootstrap, extra, role)
    existing = set(admin.list_topics(timeout=timeout).topics)
    created: list[str] = []
    for name, spec in specs.items():
        if name in existing:
            continue
        if _create_one(admin, name, spec, timeout):
            created.append(name)
    _wait_for_topics(admin, list(specs), timeout)
    return created


def _create_one(admin: AdminClient, name: str, spec: TopicSpec, timeout: float) -> bool:
    """Create one topic; False when it already existed. A rejected config is an error:
    a rule topic without compaction or a data topic without retention is a misconfigured
    platform, not a degraded one."""
    new = NewTopic(name, num_partitions=spec.partitions, replication_factor=spec.replication,
                   config=dict(spec.config))
    future = admin.create_topics([new], operation_timeout=timeout, request_timeout=timeout)[name]
    try:
        future.result(timeout=timeout)
        return True
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
            return False
        raise RuntimeError(f"cannot create topic {name!r}: {exc}") from exc


def _wait_for_topics(admin: AdminClient, names: list[str], timeout: float) -> None:
    """Block until metadata lists every topic, so the caller can produce right away."""
    deadline = time.monotonic() + timeout
    while True:
        md = admin.list_topics(timeout=timeout)
        missing = [n for n in names if n not in md.topics or md.topics[n].error is not None]
        if not missing:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"topics not visible after creation: {missing}")
        time.sleep(0.05)


def end_offsets(
    consumer: Consumer, tps: Iterable[tuple[str, int]], timeout: float = 10.0
) -> dict[tuple[str, int], tuple[int, int]]:
    """(low, high) per partition, as the broker's ListOffsets reports them."""
    return {
        (t, p): tuple(consumer.get_watermark_offsets(TopicPartition(t, p), timeout=timeout))
        for t, p in tps
    }


def watermarks(bootstrap: str, topic: str, timeout: float = 10.0, role: str | None = None,
               extra: Mapping[str, object] | None = None) -> dict[int, tuple[int, int]]:
    """partition -> (low, high) for one topic; empty when the topic does not exist."""
    parts = topic_partitions(bootstrap, topic, timeout, role, extra)
    if not parts:
        return {}
    consumer = probe_consumer(bootstrap, extra, role)
    try:
        return {p: lh for (_, p), lh in end_offsets(consumer, [(topic, p) for p in parts], timeout).items()}
    finally:
        consumer.close()


def probe_consumer(bootstrap: str, extra: Mapping[str, object] | None = None, role: str | None = None) -> Consumer:
    """A consumer for offset look-ups (`end_offsets`); it never fetches records.

    It lives for one look-up: closed while its group-coordinator connection is still in
    its SASL handshake, librdkafka logs an authentication error that is none; its log
    goes to a logger that drops it, off the user's terminal (`rulectl tail`)."""
    return assign_consumer(bootstrap, {"enable.partition.eof": True, "logger": _QUIET, **(extra or {})}, role)


def read_all(bootstrap: str, topic: str, timeout: float = 30.0, role: str | None = None,
             extra: Mapping[str, object] | None = None) -> list[KafkaRecord]:
    """Every record of `topic`, in (partition, offset) order, from earliest to the end.

    The end is fixed when the call starts; records produced meanwhile may or may not be
    included. Raises TimeoutError when the broker does not deliver up to the end in time,
    because a silently partial answer (e.g. the current rule set) is worse than none.
    """
    parts = topic_partitions(bootstrap, topic, min(timeout, 10.0), role, extra)
    if not parts:
        return []
    wm = watermarks(bootstrap, topic, min(timeout, 10.0), role, extra)
    ranges = {p: (lo, hi) for p, (lo, hi) in wm.items() if hi > lo}
    if not ranges:
        return []
    # Partition EOF events end a range whose last offsets hold no record (a transaction
    # marker, a compacted-away record), instead of waiting for a record that never comes.
    consumer = assign_consumer(bootstrap, {**(extra or {}), "enable.partition.eof": True}, role)
    try:
        return _read_ranges(consumer, topic, ranges, timeout)
    finally:
        consumer.close()


def _read_ranges(
    consumer: Consumer, topic: str, ranges: Mapping[int, tuple[int, int]], timeout: float
) -> list[KafkaRecord]:
    consumer.assign([TopicPartition(topic, p, lo) for p, (lo, _) in ranges.items()])
    out: dict[int, list[KafkaRecord]] = {p: [] for p in ranges}
    next_offset = {p: lo for p, (lo, _) in ranges.items()}
    pending = set(ranges)
    deadline = time.monotonic() + timeout
    while pending:
        if time.monotonic() > deadline:
            raise TimeoutError(f"reading {topic!r}: partitions {sorted(pending)} not read to the end in {timeout}s")
        # Ask for what is still missing: consume() returns as soon as that many arrived.
        want = max(1, min(10_000, sum(ranges[p][1] - next_offset[p] for p in pending)))
        for msg in consumer.consume(num_messages=want, timeout=0.2):
            p = msg.partition()
            if msg.error() is not None:
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(msg.error())
                if p in pending and msg.offset() >= ranges[p][1]:
                    pending.discard(p)
                continue
            off = msg.offset()
            if p not in pending or off >= ranges[p][1]:
                continue
            out[p].append(to_record(msg))
            next_offset[p] = off + 1
            if off >= ranges[p][1] - 1:
                pending.discard(p)
    return [r for p in sorted(out) for r in out[p]]


def to_record(msg: object) -> KafkaRecord:
    """A confluent_kafka Message as an immutable KafkaRecord."""
    ts_type, ts = msg.timestamp()  # type: ignore[attr-defined]
    headers = tuple((k, v) for k, v in (msg.headers() or []))  # type: ignore[attr-defined]
    return KafkaRecord(
        topic=msg.topic(),  # type: ignore[attr-defined]
        partition=msg.partition(),  # type: ignore[attr-defined]
        offset=msg.offset(),  # type: ignore[attr-defined]
        key=msg.key(),  # type: ignore[attr-defined]
        value=msg.value(),  # type: ignore[attr-defined]
        timestamp_ms=ts,
        timestamp_type=SPARK_TIMESTAMP_TYPE.get(ts_type, -1),
        headers=headers,
    )


def read_all_with(consumer: Consumer, topic: str, timeout: float = 30.0, last: int | None = None) -> list[KafkaRecord]:
    """`read_all` through a consumer the caller made (e.g. the Airflow Kafka provider's
    hook, with the connection's security settings); the consumer is not closed.

    `last`: only the last N offsets of each partition (a status topic written twice a
    second is read in its recent tail, not from its start)."""
    md = consumer.list_topics(topic, timeout=min(timeout, 10.0))
    t = md.topics.get(topic)
    if t is None or t.error is not None:
        return []
    wm = end_offsets(consumer, [(topic, p) for p in sorted(t.partitions)], min(timeout, 10.0))
    ranges = {p: (lo if last is None else max(lo, hi - last), hi) for (_, p), (lo, hi) in wm.items() if hi > lo}
    return _read_ranges(consumer, topic, ranges, timeout) if ranges else []
