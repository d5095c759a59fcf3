"""Class-data sharing archives for the platform's JVMs (HotSpot AppCDS, JDK 17).

Every Spark JVM the platform starts (a detection job and each of its restarts, the
archive job, a backtest's spark-submit, an Airflow task's quality check, `rulectl
connect`) and every Kafka broker loads and verifies the same thousands of classes from
the same jars before it does any work. A dynamic archive of those classes, written once
by `.ci/setup`, is mapped into each JVM instead: the JVM skips parsing and verifying
them. `tests/benchmarks/bench_jvm_start.py` measures a Spark session's start with and
without it (docs/benchmarks.md).

An archive is only valid for the JDK and the exact class path it was written with;
HotSpot checks both and, on any mismatch (or a missing file), starts as it would
without it (`-Xshare:auto`, the default). So the file name carries a digest of the
JDK and the jars, a changed install writes a new archive, and a JVM given a stale one
loses only the speed-up. Only classes of the JVM's own class path are archived:
the platform's jar and Spark's jars (`pyspark/jars`), and the broker's class path, not
the jars Spark loads at run time (`spark.jars`). HotSpot maps an archive only into a
JVM whose class path begins as the archive's did, so every platform Spark JVM puts the
platform's jar first (spark_jobs/spark.py, `jvm_options`; the standalone cluster's
daemons, spark_jobs/platform/spark_cluster.py).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Literal

Kind = Literal["spark", "broker"]
KINDS: tuple[Kind, ...] = ("spark", "broker")
# Set by the training run (`python -m spark_jobs.jvm.class_archive`): `kind:path`, the
# JVMs of that kind write their loaded classes to `path` at exit instead of mapping one.
DUMP_ENV = "RULES_CDS_DUMP"
OFF_ENV = "RULES_CDS"  # "off": no archive at all (to measure without one)


def _java() -> Path | None:
    """The JDK the platform's JVMs run (the broker's own lookup: $RULES_JAVA, $JAVA_HOME,
    the PATH), or None without one."""
    from spark_jobs.kafka.broker import BrokerError, java_binary

    try:
        return Path(java_binary()).resolve()
    except BrokerError:
        return None


def _class_path(kind: Kind) -> list[Path]:
    if kind == "spark":
        import pyspark

        from spark_jobs.jvm import operator_jar

        head = operator_jar()  # first on every platform Spark JVM's class path (spark.py: jvm_options)
        return [*([head] if head else []), *sorted((Path(pyspark.__file__).parent / "jars").glob("*.jar"))]
    from spark_jobs.jvm import module_jars

    return module_jars("broker")


def archive_path(kind: Kind) -> Path | None:
    """Where the archive for this JDK and class path is (or would be written)."""
    from spark_jobs.jvm import jars_dir

    java = _java()
    if java is None:
        return None
    h = hashlib.sha256(kind.encode())
    for f in (java, *_class_path(kind)):
        st = f.stat()
        h.update(f"{f}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return jars_dir() / "cds" / f"{kind}-{h.hexdigest()[:16]}.jsa"


def jvm_flags(kind: Kind) -> list[str]:
    """The HotSpot options that map this kind's archive (none when there is none)."""
    if os.environ.get(OFF_ENV) == "off":
        return []
    dump = os.environ.get(DUMP_ENV, "")
    if dump.startswith(f"{kind}:"):
        return [f"-XX:ArchiveClassesAtExit={dump.split(':', 1)[1]}"]
    path = archive_path(kind)
    return [f"-XX:SharedArchiveFile={path}"] if path is not None and path.is_file() else []


def ensure_archive(kind: Kind) -> Path | None:
    """This kind's archive, written by a training run when it is missing; None without
    a JDK. Under a file lock (parallel set-ups), written to a temporary name first."""
    path = archive_path(kind)
    if path is None or path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.is_file():
            return path
        tmp = path.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        env = {**os.environ, DUMP_ENV: f"{kind}:{tmp}"}
        env.pop(OFF_ENV, None)
        done = subprocess.run([sys.executable, "-m", "spark_jobs.jvm.class_archive", kind], env=env,
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0 or not tmp.is_file():
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"class archive {kind}: training run failed ({done.returncode}): "
                               f"{(done.stdout + done.stderr)[-2000:]}")
        for old in path.parent.glob(f"{kind}-*.jsa"):
            old.unlink()
        tmp.rename(path)
    return path


def _train_spark() -> None:
    """What the platform's Spark JVMs do, small: JSON to VARIANT, projections and
    filters, a shuffle and a sort, a Delta table written and read, and a stateful
    streaming query on the RocksDB state store, so their classes are in the archive."""
    from pyspark.sql import functions as F

    from spark_jobs.spark import session

    spark = session("class-archive", extra={
        "spark.sql.streaming.stateStore.providerClass":
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"})
    with tempfile.TemporaryDirectory() as tmp:
        raw = spark.createDataFrame([(f"t{i % 3}", i, f'{{"user": "u{i % 5}", "amount": {i}.5}}') for i in range(50)],
                                    "topic string, seq long, raw string")
        v = raw.withColumn("v", F.try_parse_json("raw"))
        agg = (v.filter(F.try_variant_get("v", "$.amount", "double") > 3)
               .groupBy(F.try_variant_get("v", "$.user", "string").alias("k"))
               .agg(F.count("*").alias("n"), F.max("seq").alias("m")).orderBy("k"))
        agg.collect()
        v.drop("v").write.format("delta").partitionBy("topic").save(f"{tmp}/t")
        spark.read.format("delta").load(f"{tmp}/t").filter("seq > 10").count()
        # A bounded source (files) and an available-now trigger: the query ends by itself.
        # A rate source never runs out, and `processAllAvailable` on it chases offsets
        # that move on every second: on a slow machine, for ever.
        raw.write.json(f"{tmp}/in")
        src = spark.readStream.schema("topic string, seq long, raw string").json(f"{tmp}/in")
        q = (src.withColumn("at", F.timestamp_seconds("seq")).withWatermark("at", "1 second")
             .groupBy(F.col("seq") % 3).count()
             .writeStream.format("noop").outputMode("update").trigger(availableNow=True)
             .option("checkpointLocation", f"{tmp}/cp").start())
        q.awaitTermination(300)
        q.stop()
    spark.stop()


def _train_broker() -> None:
    """A broker formatted, started, a topic written and read back, stopped in order."""
    from confluent_kafka import Consumer, Producer

    from spark_jobs.kafka.broker import EmbeddedBroker, free_port

    with EmbeddedBroker(port=free_port(), topics=["warm"]) as broker:
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for i in range(20):
            producer.produce("warm", f"{i}".encode())
        producer.flush(30)
        consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "warm",
                             "auto.offset.reset": "earliest"})
        consumer.subscribe(["warm"])
        got = 0
        for _ in range(30):
            got += len(consumer.consume(20, timeout=1.0))
            if got >= 20:
                break
        consumer.close()


if __name__ == "__main__":
    {"spark": _train_spark, "broker": _train_broker}[sys.argv[1]]()
