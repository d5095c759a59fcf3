"""The Spark session the jobs use, with settings that matter for correctness.

UTC session time zone: ISO timestamps without an offset are UTC (DESIGN.md).
PYSPARK_PYTHON: workers must run the project's interpreter, or they miss
pandas/pyarrow/protobuf that transformWithState needs.
spark.jars: Spark's own Kafka connector, resolved by Maven (`spark_jobs.jvm`), as local
paths (Spark's --packages/Ivy ignores Maven's mirror settings).
"""

from __future__ import annotations

import os
import sys

from pyspark.sql import SparkSession

DEFAULT_MASTER = "local[2]"

# HotSpot leaves methods over 8000 bytes of bytecode to its interpreter, and Spark's
# generated code for a rule set can be that big: the backtest's fifty threshold rules
# in one projection compile to one method of 14.5 kB. Interpreted, that part ran 4-5x
# slower (JFR: most samples in `generate_doConsume_0`). This lets the JIT compile them.
JVM_OPTIONS = "-XX:-DontCompileHugeMethods"


# Option keys whose values never show in a plan: URLs (Spark's default) and the Kafka
# connector's SASL settings (`kafka.sasl.jaas.config`, `kafka.sasl.password`, ...).
REDACTION_REGEX = "(?i)url|jaas|sasl[.].*(password|config)|ssl[.].*password"


def session(app_name: str, master: str | None = None, shuffle_partitions: int = 2, extra: dict | None = None,
            kafka: bool = True) -> SparkSession:
    """The session the jobs use; `kafka` adds Spark's Kafka connector to it (resolving
    the jars with Maven the first time)."""
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
    }
    if kafka:
        from spark_jobs.jvm import spark_jars

        conf["spark.jars"] = spark_jars()
    conf.update(extra or {})
    for side in ("driver", "executor"):
        key = f"spark.{side}.extraJavaOptions"
        conf[key] = f"{JVM_OPTIONS} {conf.get(key, '')}".strip()
    for k, v in conf.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("SPARK_LOG_LEVEL", "WARN"))
    return spark
