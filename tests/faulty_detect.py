"""`rulectl detect` with a fault injected from the test side:

    python tests/faulty_detect.py [--stall SECONDS] MARKER detect --bootstrap ...

runs the job as `rulectl detect` does, except that the input of its plan is wrapped so
that a record whose text holds MARKER fails its micro-batch in the JVM (Spark's
raise_error) unless the record is quarantined (test_batch_quarantine.py), or, with
`--stall`, holds its task that many seconds: the micro-batch stays in flight, for a test
to kill the job in the middle of it (test_detection_job.py). The job's code holds no
such hook; this wraps `job._input` before the job builds its plan.
"""

from __future__ import annotations

import sys

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs import cli
from spark_jobs.streaming import job

FAULT = "injected fault (tests/faulty_detect.py)"


def _faulty(marker: str, stall_s: int = 0):
    plain = job._input

    def _input(*args, **kwargs) -> DataFrame:
        raw = plain(*args, **kwargs)
        hit = F.col("raw").contains(F.lit(marker)) & F.col("_quarantine").isNull()
        if stall_s:
            slept = F.reflect(F.lit("java.lang.Thread"), F.lit("sleep"), F.lit(stall_s * 1000).cast("long"))
            # The record itself, after the sleep: an empty cut of the call's text.
            return raw.withColumn("raw", F.when(hit, F.concat(F.col("raw"), F.substring(
                F.coalesce(slept, F.lit("")), 1, 0))).otherwise(F.col("raw")))
        return raw.withColumn("raw", F.when(hit, F.raise_error(F.lit(FAULT))).otherwise(F.col("raw")))

    return _input


if __name__ == "__main__":
    args = sys.argv[1:]
    stall = 0
    if args[0] == "--stall":
        stall, args = int(args[1]), args[2:]
    job._input = _faulty(args[0], stall)
    sys.exit(cli.main(args[1:]))
