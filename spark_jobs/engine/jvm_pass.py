"""The backtest's keyed rules run the live job's own Java (spark_jobs/jvm/processor):
`BatchVelocity.fired` and `BatchCorrelation.judged`, one pass over a key's sorted rows.

A classic session calls them through Py4J. A Spark Connect client has no Py4J gateway,
so it sends an extension relation that the server's `ConnectPasses` plugin turns into
the same pass (`rulectl connect` starts the server with it). Either way one
implementation of each rule kind's window and context logic serves the live job and
every backtest; a session without the jar is an error (spark.jvm_class), not a
switch to another evaluator.
"""

from __future__ import annotations

from typing import Literal

from pyspark.sql import DataFrame
from pyspark.sql.connect import proto
from pyspark.sql.connect.client import SparkConnectClient
from pyspark.sql.connect.dataframe import DataFrame as ConnectDataFrame
from pyspark.sql.connect.plan import LogicalPlan

from spark_jobs.spark import jvm_class

Pass = Literal["velocity", "correlation", "thresholds", "keyed"]

# The JVM entry point of each pass: class and static method, as ConnectPasses names it.
ENTRIES: dict[Pass, tuple[str, str]] = {
    "velocity": ("ruleplatform.keyed.BatchVelocity", "fired"),
    "correlation": ("ruleplatform.keyed.BatchCorrelation", "judged"),
    "thresholds": ("ruleplatform.rules.Evaluate", "thresholdPass"),
    "keyed": ("ruleplatform.rules.Evaluate", "keyedPass"),
}

def run_pass(df: DataFrame, which: Pass, spec: str) -> DataFrame:
    """`df` through the JVM pass `which` with `spec` (JSON), on the session `df` is on."""
    if isinstance(df, ConnectDataFrame):
        return ConnectDataFrame(PassRelation(df._plan, ".".join(ENTRIES[which]), spec), df.sparkSession)
    return _classic(df, which, spec)


def _classic(df: DataFrame, which: Pass, spec: str) -> DataFrame:
    cls, method = ENTRIES[which]
    entry = jvm_class(df.sparkSession, cls)
    assert entry is not None  # a classic session has a gateway
    return DataFrame(getattr(entry, method)(df._jdf, spec), df.sparkSession)


class PassRelation(LogicalPlan):
    """An extension relation for ConnectPasses: a Project over the input whose two
    expressions are the pass's name and its spec, packed in the extension's Any."""

    def __init__(self, child: LogicalPlan, name: str, spec: str) -> None:
        super().__init__(child)
        self._name = name
        self._spec = spec

    def plan(self, session: SparkConnectClient) -> proto.Relation:
        inner = proto.Relation()
        inner.project.input.CopyFrom(self._child.plan(session))
        for text in (self._name, self._spec):
            inner.project.expressions.add().literal.string = text
        rel = self._create_proto_relation()
        rel.extension.Pack(inner)
        return rel
