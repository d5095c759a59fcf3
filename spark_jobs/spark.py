"""The Spark session the jobs use, with settings that matter for correctness.

UTC session time zone: ISO timestamps without an offset are UTC (docs/rule-language.md,
"Timestamps").
PYSPARK_PYTHON: workers must run the project's interpreter, or they miss
pandas/pyarrow/protobuf that transformWithState needs.
spark.jars: Spark's own Kafka connector and Delta Lake, resolved by Maven
(`spark_jobs.jvm`), as local paths (Spark's --packages/Ivy ignores Maven's mirror
settings). Delta's SQL extension and catalog are set with them, so the event archive
(`spark_jobs.archive`) is readable and writable as `delta` (and `OPTIMIZE`/`VACUUM`
parse) in every session the platform builds.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from py4j.java_gateway import JavaClass
from pyspark.sql import Column, SparkSession

DEFAULT_MASTER = "local[2]"

# HotSpot leaves methods over 8000 bytes of bytecode to its interpreter, and Spark's
# generated code for a rule set can be that big: the backtest's fifty threshold rules
# in one projection compile to one method of 14.5 kB. Interpreted, that part ran 4-5x
# slower (JFR: most samples in `generate_doConsume_0`). This lets the JIT compile them.
JVM_OPTIONS = "-XX:-DontCompileHugeMethods"

# Batch work (backtests, the Spark Connect server and the spark-submit that run them,
# the archive's maintenance and quality checks) runs on HotSpot's throughput collector.
# A backtest is CPU-bound on two cores, and G1 (the JVM's default) spends some of them
# on its write barriers and concurrent threads: warm backtests ran faster on the
# parallel collector (bench_backtest.py, docs/benchmarks.md). The streaming jobs
# (detection, archive) keep G1, whose pauses stay short as their state and heap grow;
# a full collection of the throughput collector would stop a micro-batch for as long
# as the old generation takes to mark.
BATCH_GC = "-XX:+UseParallelGC"
_CHOSEN_GC = re.compile(r"-XX:\+Use\w*GC\b")


def jvm_options(conf: dict[str, str], streaming: bool = False) -> dict[str, str]:
    """`conf` with the platform's JVM options for the driver and executors in front of
    any it already gives (a later `-XX` flag wins); a collector chosen there is kept, as
    HotSpot refuses to start with two. The class archive of Spark's jars, where set-up
    wrote one (spark_jobs/jvm/class_archive.py), comes first, and the platform's jar
    heads the class path: HotSpot maps the archive only into a JVM whose class path
    starts as the archive's did, and the streaming jobs need that jar there (their
    local file system, `local_checkpoint_conf`), so every platform JVM has it there."""
    from spark_jobs.jvm import operator_jar
    from spark_jobs.jvm.class_archive import jvm_flags

    out = dict(conf)
    head = operator_jar()
    for side in ("driver", "executor") if head is not None else ():
        key = f"spark.{side}.extraClassPath"
        given = [p for p in out.get(key, "").split(os.pathsep) if p and p != str(head)]
        out[key] = os.pathsep.join([str(head), *given])
    cds = " ".join(jvm_flags("spark"))
    for side in ("driver", "executor"):
        key = f"spark.{side}.extraJavaOptions"
        given = out.get(key, "")
        ours = JVM_OPTIONS if streaming or _CHOSEN_GC.search(given) else f"{JVM_OPTIONS} {BATCH_GC}"
        ours = f"{cds} {ours}".strip()
        out[key] = f"{ours} {given}".strip()
    return out


# Delta Lake's hooks into Spark SQL (its jar is in the `spark` jar module).
#
# snapshotPartitions: Delta keeps a table's state (one row per data file) cached in 50
# partitions by default, and every read of the archive lists the files of its window
# with a Spark job over that state: 50 tasks of a few rows each, a noticeable serial
# cost of a warm backtest on two cores before any event is read; 2 partitions make it
# a small one. The archive's state stays small (compacted and
# vacuumed daily, `archive_maintenance`); a table of millions of files would want more
# (the settings' `spark_conf`, or `extra` here, overrides it).
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
    "spark.databricks.delta.snapshotPartitions": "2",
}

# Settings fixed when the JVM starts (static SQL settings), so every way a platform
# session starts passes them: a session here, `rulectl connect`, spark-submit.
#
# Spark keeps the classes it generates for a plan's code in a cache of 100 entries by
# default. A backtest of the 62-rule benchmark generates ~215 classes: the least
# recently used went first, so a second backtest of the same rules on the same session
# found none of its classes, compiled every one again (Janino, 2.3-2.8 s) and, the
# classes being new, the JIT compiled their bytecode again too: 16-22 s of compiler
# threads' CPU per warm run on two cores, as much as the tasks' own. With room for
# 1,000 the second run compiles nothing (bench_backtest.py --repeat, README).
STATIC_CONF = {"spark.sql.codegen.cache.maxEntries": "1000"}


# The streaming jobs' checkpoints are local folders. Spark writes them through Hadoop's
# FileContext by default, whose local file system, without Hadoop's native library (pip's
# pyspark has none), starts a process for each permission it sets (`chmod`) and each
# link it checks (`readlink`, several per file renamed into place): dozens of processes
# per micro-batch, each a fork of the driver's JVM. Hadoop's FileSystem API renames
# without link checks (local renames are atomic), which leaves one `chmod` per file
# (checksum files included), the driver's offsets and commits and each state store's
# changelog; on a local master the platform's local file system (FORKLESS_LOCAL_FS)
# sets those permissions through java.nio instead (bench_idle_job.py). Not for
# checkpoints on HDFS or an object store, where FileContext's rename is the safe one.
LOCAL_CHECKPOINT_CONF = {
    "spark.sql.streaming.checkpointFileManagerClass":
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
}
FORKLESS_LOCAL_FS: str | None = "ruleplatform.fs.ForklessLocalFileSystem"


def local_checkpoint_conf(master: str | None) -> dict[str, str]:
    """LOCAL_CHECKPOINT_CONF, and on a local master (driver and executors one JVM) the
    platform's local file system. Hadoop makes its `file:` file system while the JVM
    starts, before `spark.jars` reach a class loader, so it needs the platform's jar on
    the driver's class path, where `jvm_options` puts it; a cluster's executors keep
    Hadoop's own, as does a driver that spark-submit started (its class path is fixed
    by then)."""
    from spark_jobs.jvm import ensure_jars

    conf = dict(LOCAL_CHECKPOINT_CONF)
    master = master or os.environ.get("SPARK_MASTER") or DEFAULT_MASTER
    if FORKLESS_LOCAL_FS and master.startswith("local") and not os.environ.get("PYSPARK_GATEWAY_PORT"):
        ensure_jars()  # built before the session asks for its jars: jvm_options finds the jar
        conf["spark.hadoop.fs.file.impl"] = FORKLESS_LOCAL_FS
    return conf


REMOTE_ENV = "SPARK_REMOTE"
DEFAULT_CONNECT_PORT = 15002


def remote_session(url: str) -> SparkSession:
    """A Spark Connect session on a running server (`rulectl connect`): no JVM start-up
    here, and the server's JIT is already warm (README: a backtest's fixed cost)."""
    # Under spark-submit (the release's backtest operator) $MASTER names the launcher's
    # own master; a Connect client has none, and PySpark refuses a master and a remote
    # together.
    os.environ.pop("MASTER", None)
    return SparkSession.builder.remote(url).getOrCreate()


def connect_server_argv(port: int = DEFAULT_CONNECT_PORT, master: str = DEFAULT_MASTER,
                        extra: dict | None = None) -> list[str]:
    """spark-submit of the pyspark package's Spark Connect server with the platform's
    session settings (jars, Delta, UTC, the JIT option) and its relation plugin, which
    runs the rules' JVM passes for Connect clients: what `rulectl connect` runs."""
    from pathlib import Path

    import pyspark

    from spark_jobs.jvm import spark_jars

    conf = {
        "spark.jars": spark_jars(),
        **DELTA_CONF,
        **STATIC_CONF,
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        # The backtest's JVM passes for Connect clients (spark_jobs/engine/jvm_pass.py).
        "spark.connect.extensions.relation.classes": "ruleplatform.keyed.ConnectPasses",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": "2",
        "spark.ui.enabled": "false",
        "spark.sql.adaptive.enabled": "true",
        "spark.python.sql.dataFrameDebugging.enabled": "false",
        "spark.driver.memory": os.environ.get("SPARK_DRIVER_MEMORY", "4g"),
        **(extra or {}),
    }
    conf = jvm_options(conf)
    argv = [str(Path(pyspark.__file__).parent / "bin" / "spark-submit"), "--master", master,
            "--class", "org.apache.spark.sql.connect.service.SparkConnectServer"]
    for k, v in conf.items():
        argv += ["--conf", f"{k}={v}"]
    return [*argv, "spark-internal"]


# Option keys whose values never show in a plan: URLs (Spark's default) and the Kafka
# connector's SASL settings (`kafka.sasl.jaas.config`, `kafka.sasl.password`, ...).
REDACTION_REGEX = "(?i)url|jaas|sasl[.].*(password|config)|ssl[.].*password"


def submit_jars_and_conf() -> tuple[str, dict[str, str]]:
    """What a spark-submit of a platform job needs on its command line: `--jars` (Kafka
    connector, Delta Lake), Delta's SQL extension and catalog and STATIC_CONF as `--conf`.
    Not the JVM options: the caller merges its conf first, then applies `jvm_options`,
    which puts the platform's options in front of any the conf gives."""
    from spark_jobs.jvm import spark_jars

    return spark_jars(), {**DELTA_CONF, **STATIC_CONF}


def session(app_name: str, master: str | None = None, shuffle_partitions: int = 2, extra: dict | None = None,
            kafka: bool = True, streaming: bool = False) -> SparkSession:
    """The session the jobs use; `kafka` adds the platform's jars to it (Spark's Kafka
    connector and Delta Lake, with Delta's SQL extension and catalog), resolving them
    with Maven the first time. `streaming`: a long-running streaming job (its JVM keeps
    G1, see BATCH_GC)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name)
    master = master or os.environ.get("SPARK_MASTER")
    if master:
        builder = builder.master(master)
    elif not os.environ.get("PYSPARK_GATEWAY_PORT"):
        # Not launched by spark-submit (which sets the gateway and the master): local.
        builder = builder.master(DEFAULT_MASTER)
    conf = {
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.adaptive.enabled": "true",
        "spark.driver.memory": os.environ.get("SPARK_DRIVER_MEMORY", "4g"),
        "spark.python.worker.reuse": "true",
        # On, PySpark records the Python call site of every Column function through
        # several Py4J round trips each; a 60-rule plan then takes tens of seconds to
        # build. Errors still name the failing expression.
        "spark.python.sql.dataFrameDebugging.enabled": "false",
        # Data source options shown in plans (explain, the SQL tab, query events) are
        # redacted when key or value matches this or `spark.redaction.regex` (default
        # `(?i)secret|password|token|access[.]?key`). Spark 4.2's default here is
        # `(?i)url`, so the Kafka connector's JAAS line was hidden only because a SCRAM
        # line happens to contain the word "password"; naming the keys makes it hold for
        # any login module (tests/integration/test_kafka_security.py).
        "spark.sql.redaction.options.regex": REDACTION_REGEX,
        **STATIC_CONF,
    }
    if kafka and not os.environ.get("PYSPARK_GATEWAY_PORT"):
        # Under spark-submit the driver's JVM is already running: jars named here would
        # reach the executors but not the driver's class loader, and Delta's extension
        # would then fail every query in the analyzer. The submitter passes them
        # (`submit_jars_and_conf`, used by the Airflow backtest operator).
        jars, delta_conf = submit_jars_and_conf()
        conf["spark.jars"] = jars
        conf.update(delta_conf)
    conf.update(extra or {})
    conf = jvm_options(conf, streaming)
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("SPARK_LOG_LEVEL", "WARN"))
    return spark


@contextmanager
def session_conf(spark: SparkSession, conf: dict[str, str]) -> Iterator[None]:
    """`conf` for the duration, then each key as it was (or unset): the session may be
    the caller's (a notebook, a test, a long-lived Airflow worker's)."""
    before = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


class MissingJarError(RuntimeError):
    """A classic session without the platform's jar: the rules' JVM code cannot run."""


def jvm_class(spark: SparkSession, name: str) -> JavaClass | None:
    """The JVM class `name` (dotted) of a classic session; None on Spark Connect (no Py4J
    gateway: the caller sends its work to the server instead). A classic session
    without the platform's jars is an error that says how to get them, never a quiet
    switch to another code path."""
    entry = getattr(spark, "_jvm", None)
    if entry is None:
        return None
    for part in name.split("."):
        entry = getattr(entry, part)
    if not isinstance(entry, JavaClass):
        # Py4J resolves an unknown name to a package, not a class.
        raise MissingJarError(
            f"{name} is not on this Spark session's classpath: the platform's jar is missing. Start the session "
            "with spark_jobs.spark.session(), which builds the jars with Maven and loads them, or give "
            "spark-submit the jars of spark_jobs.spark.submit_jars_and_conf() (--jars)")
    return entry


def jvm_column(spark: SparkSession, name: str, method: str, *args: object, what: str) -> Column:
    """The column a static method of the platform's JVM class `name` builds from `args`
    (columns passed as theirs). A classic session only: on Spark Connect, which has no
    Py4J gateway, it raises NotImplementedError naming `what`."""
    entry = jvm_class(spark, name)
    if entry is None:
        raise NotImplementedError(f"{what} on Spark Connect")
    from pyspark.sql.classic.column import Column as ClassicColumn

    java = [a._jc if isinstance(a, Column) else a for a in args]  # type: ignore[attr-defined]
    return ClassicColumn(getattr(entry, method)(*java))


def shuffle_partitions(spark: SparkSession) -> int:
    """The session's shuffle partitions: how many tasks it runs a stage in (the width the
    backtest keeps its inputs and output lines at, what the live job balances its key
    buckets over)."""
    return int(spark.conf.get("spark.sql.shuffle.partitions", "2") or 2)
