"""The parsed events of a backtest, kept on the executors for the run.

Every rule group, the dead letters and the summary read the parsed events, so they are
computed once and kept. On a local master they are kept as a local checkpoint, not as
a cached DataFrame, for two reasons measured on a warm session (README, machine V):

- a checkpoint is a leaf of every plan built over it. Over a cached DataFrame, each
  DataFrame step of the rules' planning is analyzed over the whole plan that made the
  events (the archive's scan, the window, the extraction of ~60 fields), once per
  branch that reads them; Spark's analyzer re-walks it at every step
  (`DeduplicateRelations` alone was a fifth of the driver's planning time). Over the
  leaf, planning a 62-rule set took 0.39-0.47 s instead of 0.55-0.76 s;
- its blocks are the rows as the scan made them: no columnar batches to build. The scan
  and keep of 200k events took 1.0-1.2 s instead of 1.35-1.5 s.

A warm 200k-event backtest went from a median 4.09 s to 3.28 s, 1M events from 13.3 s
to 10.9 s (A/B in one JVM, alternating).

A local checkpoint is not recomputed: were an executor lost, its blocks would be gone
and the run would fail ("Checkpoint block ... not found"), where a cache recomputes
the lost partitions. So it is used only on a local master, whose executor is the
driver's own JVM (a run that loses it is lost anyway). On a cluster (`spark://...`,
`local-cluster[...]`) and on Spark Connect the events are cached (`persist`) and
unpersisted at the end, as before.

Spark has no API to drop a local checkpoint; its blocks would stay until the driver's
garbage collector collects the RDD, which on a warm session may be much later. So the
release unpersists the checkpoint's RDD through the JVM handle.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from pyspark import StorageLevel
from pyspark.sql import DataFrame

# As rows, not serialized: every rule group's stage, the dead letters and the summary
# pass over the kept events (a dozen passes in the benchmark), and PySpark's
# MEMORY_AND_DISK is the serialized level, so each pass deserialized every row again: a
# filtered pass over 1M kept events took 0.21-0.28 s, 0.13-0.16 s over rows kept as
# objects (422 MB for 1M benchmark events). A warm 1M-event backtest took a median 10.60 s
# with serialized blocks, 8.97 s with these (A/B in one JVM, README, machine W). Past
# memory they spill to disk: nothing is recomputed.
LEVEL = StorageLevel.MEMORY_AND_DISK_DESER


def checkpoint_is_safe(df: DataFrame) -> bool:
    """Whether `df` may be kept as a local checkpoint: a classic session on a local
    master (one JVM). Spark Connect sessions have no `_jdf`."""
    if getattr(df, "_jdf", None) is None:
        return False
    master = df.sparkSession.sparkContext.master
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
    # The checkpoint's plan is a LogicalRDD over the RDD whose blocks are kept.
    rdd = leaf._jdf.queryExecution().analyzed().rdd()
    try:
        yield leaf
    finally:
        rdd.unpersist(False)
