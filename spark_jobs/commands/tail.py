"""`rulectl tail TOPIC`: print a topic's records as they arrive (like `tail -f`).

The quickest way to watch the platform work: `rulectl tail events.processed` shows
detections as the job emits them, `rulectl tail events.deadletter` the rejected input.
Partitions are assigned (no consumer group: nothing is committed, no rebalance). By
default it starts at the current end of every partition (`end_offsets`);
`--from-beginning` starts at the earliest offset instead.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from typing import TextIO

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from spark_jobs.commands.signals import install_handlers as _install_handlers
from spark_jobs.commands.signals import restore_handlers as _restore_handlers
from spark_jobs.kafka.admin import assign_consumer, end_offsets, probe_consumer, topic_partitions

# A read-only consumer: with SASL on (KAFKA_CREDENTIALS_FILE, see README "Kafka
# security") it authenticates as `reader` unless KAFKA_PRINCIPAL says otherwise.
ROLE = "reader"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tail", help="print a topic's records as they arrive", description=__doc__.splitlines()[0]
    )
    p.add_argument("topic", help="topic to follow, e.g. events.processed")
    p.add_argument(
        "--bootstrap",
        default=os.environ.get("KAFKA_BOOTSTRAP", "127.0.0.1:9092"),
        help="Kafka bootstrap servers",
    )
    p.add_argument(
        "--from-beginning", action="store_true", help="start at the earliest offset, not at the end"
    )
    p.add_argument("--max", type=int, default=None, metavar="N", help="exit after N records")
    p.add_argument(
        "--timeout", type=float, default=None, metavar="S", help="exit after S seconds without a new record"
    )
    p.add_argument("--meta", action="store_true", help="prefix each record with partition, offset and key")
    p.add_argument("--pretty", action="store_true", help="indent JSON values")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    stop = threading.Event()
    previous = _install_handlers(stop)
    try:
        return follow(
            args.bootstrap,
            args.topic,
            from_beginning=args.from_beginning,
            max_records=args.max,
            idle_timeout=args.timeout,
            meta=args.meta,
            pretty=args.pretty,
            stop=stop,
        )
    except KafkaException as exc:
        print(f"rulectl tail: {exc}", file=sys.stderr)
        from spark_jobs.kafka.client_config import CREDENTIALS_ENV

        if not os.environ.get(CREDENTIALS_ENV):
            print(f"rulectl tail: no Kafka credentials: a broker with SASL users (rulectl up without --insecure) "
                  f"needs {CREDENTIALS_ENV}=<workdir>/kafka-credentials.json, or run this where `make up` runs "
                  "(it finds var/platform.json)", file=sys.stderr)
        return 1
    finally:
        _restore_handlers(previous)


def follow(
    bootstrap: str,
    topic: str,
    *,
    from_beginning: bool = False,
    max_records: int | None = None,
    idle_timeout: float | None = None,
    meta: bool = False,
    pretty: bool = False,
    stop: threading.Event | None = None,
    out: TextIO | None = None,
) -> int:
    """Print records of `topic` until stopped, `max_records` printed or `idle_timeout` idle.

    Waits for the topic to exist (a job may create its sink topic later). Returns 0.
    """
    stop = stop or threading.Event()
    out = out or sys.stdout
    partitions = _wait_for_partitions(bootstrap, topic, stop)
    if partitions is None:
        return 0
    consumer = assign_consumer(bootstrap, {"enable.partition.eof": False, "fetch.wait.max.ms": 100}, ROLE)
    try:
        start = _start_positions(bootstrap, topic, partitions, from_beginning)
        next_offset = {tp.partition: tp.offset for tp in start}
        consumer.assign(start)
        printed = 0
        last_activity = time.monotonic()
        next_partition_check = time.monotonic() + 10.0
        while not stop.is_set():
            msgs = consumer.consume(num_messages=500, timeout=0.25)
            for msg in msgs:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(err)
                print(_format(msg, meta, pretty), file=out, flush=True)
                next_offset[msg.partition()] = msg.offset() + 1
                printed += 1
                last_activity = time.monotonic()
                if max_records is not None and printed >= max_records:
                    return 0
            now = time.monotonic()
            if idle_timeout is not None and now - last_activity >= idle_timeout:
                return 0
            if now >= next_partition_check:
                # Partitions added to the topic meanwhile are followed from their start.
                added = sorted(set(topic_partitions(bootstrap, topic, role=ROLE)) - set(next_offset))
                if added:
                    next_offset.update(dict.fromkeys(added, 0))
                    consumer.assign([TopicPartition(topic, p, off) for p, off in sorted(next_offset.items())])
                next_partition_check = now + 10.0
        return 0
    finally:
        consumer.close()


def _wait_for_partitions(bootstrap: str, topic: str, stop: threading.Event) -> list[int] | None:
    announced = False
    while not stop.is_set():
        parts = topic_partitions(bootstrap, topic, role=ROLE)
        if parts:
            return parts
        if not announced:
            print(
                f"rulectl tail: waiting for topic {topic!r} on {bootstrap} ...", file=sys.stderr, flush=True
            )
            announced = True
        stop.wait(1.0)
    return None


def _start_positions(
    bootstrap: str, topic: str, partitions: list[int], from_beginning: bool
) -> list[TopicPartition]:
    probe = probe_consumer(bootstrap, role=ROLE)
    try:
        bounds = end_offsets(probe, [(topic, p) for p in partitions])
    finally:
        probe.close()
    return [TopicPartition(topic, p, bounds[(topic, p)][0 if from_beginning else 1]) for p in partitions]


def _format(msg: object, meta: bool, pretty: bool) -> str:
    raw = msg.value()  # type: ignore[attr-defined]
    text = "<null>" if raw is None else raw.decode("utf-8", errors="replace")
    if pretty and raw is not None:
        with contextlib.suppress(ValueError):  # not JSON: print it as it is
            text = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    if not meta:
        return text
    key = msg.key()  # type: ignore[attr-defined]
    key_text = "-" if key is None else key.decode("utf-8", errors="replace")
    return f"p{msg.partition()}@{msg.offset()} key={key_text} {text}"  # type: ignore[attr-defined]


