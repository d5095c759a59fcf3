"""The parsed events of a backtest, kept on the executors for the run.

Every rule group, the dead letters and the summary read the parsed events, so they are
computed once and kept. On a local master they are kept as a local checkpoint, not as
a cached DataFrame, for two reasons:

- a checkpoint is a leaf of every plan built over it. Over a cached DataFrame, each
  DataFrame step of the rules' planning is analyzed over the whole plan that made the
  events (the archive's scan, the window, the extraction of ~60 fields), once per
  branch that reads them; Spark's analyzer re-walks it at every step
  (`DeduplicateRelations` alone was a large share of the driver's planning time). Over
  the leaf, the rules' planning does not walk the scan again;
- its blocks are the rows as the scan made them: no columnar batches to build, so the
  scan and keep of the events is cheaper.

Both shorten a warm backtest (bench_backtest.py, docs/benchmarks.md).

A local checkpoint is not recomputed: were an executor lost, its blocks would be gone
and the run would fail ("Checkpoint block ... not found"), where a cache recomputes
the lost partitions. So it is used only on a local master, whose executor is the
driver's own JVM (a run that loses it is lost anyway), a classic session's or a Spark
Connect server's alike. On a cluster (`spark://...`, `local-cluster[...]`) the events
are cached (`persist`) and unpersisted at the end.

On Spark Connect the leaf matters most: the client sends the whole plan at every schema
question, and the server analyzes it from scratch (each rule group's JVM pass analyzes
its input again), so over a cached DataFrame every such question re-walked the scan of
every recorded topic.

Spark has no API to drop a local checkpoint; its blocks would stay until the driver's
garbage collector collects the RDD, which on a warm session may be much later. So the
release unpersists the checkpoint's RDD through the JVM handle.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql.connect.dataframe import DataFrame as ConnectDataFrame

# As rows, not serialized: every rule group's stage, the dead letters and the summary
# pass over the kept events (a dozen passes in the benchmark), and PySpark's
# MEMORY_AND_DISK is the serialized level, so each pass deserialized every row again;
# rows kept as objects are read without that, at the price of more memory (see
# bench_backtest.py in docs/benchmarks.md). Past memory they spill to disk: nothing is recomputed.
LEVEL = StorageLevel.MEMORY_AND_DISK_DESER


def checkpoint_is_safe(df: DataFrame) -> bool:
    """Whether `df` may be kept as a local checkpoint: its session (classic, or the
    Spark Connect server's) runs on a local master (one JVM)."""
    master = df.sparkSession.conf.get("spark.master", "") or ""
    return master == "local" or master.startswith("local[")


@contextmanager
def kept(df: DataFrame) -> Iterator[DataFrame]:
    """`df`, kept (computed by its first action, shared by every later one) until the
    block exits; its blocks are then released."""
    if not checkpoint_is_safe(df):
        cached = df.persist(LEVEL)
        try:
            yield cached
        finally:
            cached.unpersist()
        return
    leaf = df.localCheckpoint(eager=False, storageLevel=LEVEL)
    if isinstance(leaf, ConnectDataFrame):
        # A reference to a DataFrame the server keeps for the session; pyspark releases
        # it (RemoveRemoteCachedRelation) when the last DataFrame over it is dropped.
        yield leaf
        return
    # The checkpoint's plan is a LogicalRDD over the RDD whose blocks are kept.
    rdd = leaf._jdf.queryExecution().analyzed().rdd()
    try:
        yield leaf
    finally:
        rdd.unpersist(False)
