"""Three real KRaft brokers on loopback (`rulectl broker --brokers 3`): one is killed
mid-stream and nothing acknowledged is lost; restarted, it rejoins every ISR."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cluster_helpers import free_block, wait_until
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from tenacity import Retrying, retry_if_exception, stop_after_delay, wait_fixed

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

TOPIC = "events.raw"


def _partition_md(bootstrap: str, topic: str):
    md = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10)
    return md.topics[topic].partitions[0]


def _pids_of_node(data_dir: Path, node: int) -> list[int]:
    """The JVM of node `node`: found by its config path on its command line (pgrep)."""
    config = str(data_dir / f"node-{node}" / "server.properties")
    out = subprocess.run(["pgrep", "-f", f"kafka.Kafka {config}"], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def test_three_brokers_survive_one_killed_and_it_rejoins(tmp_path: Path) -> None:
    port = free_block(3)
    cport = port + 500
    data = tmp_path / "kafka"
    log = (tmp_path / "broker.out").open("wb")
    cmd = [sys.executable, "-m", "spark_jobs.cli", "broker", "--brokers", "3", "--port", str(port),
           "--controller-port", str(cport), "--data-dir", str(data), "--insecure"]  # plaintext: failover, not security
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    bootstrap = ",".join(f"127.0.0.1:{port + i}" for i in range(3))
    try:
        wait_until(lambda: b"cluster ready" in (tmp_path / "broker.out").read_bytes(), 150, "cluster ready")
        part = _partition_md(bootstrap, TOPIC)
        assert sorted(part.replicas) == [1, 2, 3] and sorted(part.isrs) == [1, 2, 3]
        admin = AdminClient({"bootstrap.servers": bootstrap})
        from confluent_kafka.admin import ConfigResource

        res = ConfigResource(ConfigResource.Type.TOPIC, TOPIC)
        cfg = admin.describe_configs([res])[res].result(timeout=10)
        assert cfg["min.insync.replicas"].value == "2"

        acked: list[int] = []
        failed: list[str] = []
        stop = threading.Event()

        def produce() -> None:
            p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True,
                          "linger.ms": 5, "message.timeout.ms": 60000})
            i = 0
            while not stop.is_set():
                def cb(err, msg, n=i) -> None:
                    if err is None:
                        acked.append(n)
                    else:
                        failed.append(str(err))
                p.produce(TOPIC, value=str(i).encode(), on_delivery=cb)
                p.poll(0)
                i += 1
                time.sleep(0.002)
            p.flush(60)

        t = threading.Thread(target=produce)
        t.start()
        wait_until(lambda: len(acked) > 500, 60, "records acknowledged before the kill")
        leader = _partition_md(bootstrap, TOPIC).leader
        pids = _pids_of_node(data, leader)
        assert len(pids) == 1, pids
        os.kill(pids[0], signal.SIGKILL)  # the partition's leader dies mid-stream
        before = len(acked)
        wait_until(lambda: len(acked) > before + 1000, 90, "records acknowledged after the kill")
        assert leader not in _partition_md(bootstrap, TOPIC).isrs
        stop.set()
        t.join(90)
        assert not failed, failed[:3]

        # Restart the killed node on its data folder: it catches up and is in sync again.
        node = _restart_node(data, leader, tmp_path)
        try:
            wait_until(lambda: sorted(_partition_md(bootstrap, TOPIC).isrs) == [1, 2, 3], 120, "ISR back to 3")
            records = _read_values(bootstrap)
            assert sorted(records) == sorted(acked), "acknowledged records lost or duplicated"
            assert len(set(records)) == len(records)
        finally:
            node.send_signal(signal.SIGTERM)
            node.wait(60)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        log.close()
    assert not any(_pids_of_node(data, n) for n in (1, 2, 3))


def _restart_node(data: Path, node: int, tmp_path: Path) -> subprocess.Popen:
    """The node's JVM again, from its own data folder (the command line the cluster used)."""
    from spark_jobs.kafka.broker import EmbeddedBroker

    b = EmbeddedBroker(data_dir=data / f"node-{node}")
    config = data / f"node-{node}" / "server.properties"
    out = (tmp_path / f"node-{node}-restart.log").open("wb")
    return subprocess.Popen(b._java("kafka.Kafka", str(config), heap="512m"), stdout=out, stderr=subprocess.STDOUT)


def _leader_moved(exc: BaseException) -> bool:
    return isinstance(exc, KafkaException) and exc.args[0].code() in (KafkaError.NOT_LEADER_FOR_PARTITION,
                                                                      KafkaError.LEADER_NOT_AVAILABLE)


def _read_values(bootstrap: str) -> list[int]:
    """Every record of the topic, from a plain consumer (not the platform's readers)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"oracle-{time.time()}", "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "enable.partition.eof": True})
    # The rejoined node may take its preferred leadership back while this asks: a
    # retriable NOT_LEADER_FOR_PARTITION, asked again (seen with three test workers).
    lo, hi = Retrying(retry=retry_if_exception(_leader_moved),
                      stop=stop_after_delay(60), wait=wait_fixed(1), reraise=True)(
        c.get_watermark_offsets, TopicPartition(TOPIC, 0), timeout=10)
    c.assign([TopicPartition(TOPIC, 0, lo)])
    out: list[int] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            if m.offset() >= hi:
                break
            continue
        out.append(int(m.value()))
        if m.offset() >= hi - 1:
            break
    c.close()
    return out
