"""`rulectl detect` with a fault injected from the test side (test_batch_quarantine.py):

    python tests/faulty_detect.py MARKER detect --bootstrap ...

runs the job as `rulectl detect` does, except that the input of its plan is wrapped so
that a record whose text holds MARKER fails its micro-batch in the JVM (Spark's
raise_error) unless the record is quarantined. The job's code holds no such hook; this
wraps `job._input` before the job builds its plan.
"""

from __future__ import annotations

import sys

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark_jobs import cli
from spark_jobs.streaming import job

FAULT = "injected fault (tests/faulty_detect.py)"


def _faulty(marker: str):
    plain = job._input

    def _input(*args, **kwargs) -> DataFrame:
        raw = plain(*args, **kwargs)
        fails = F.col("raw").contains(F.lit(marker)) & F.col("_quarantine").isNull()
        return raw.withColumn("raw", F.when(fails, F.raise_error(F.lit(FAULT))).otherwise(F.col("raw")))

    return _input


if __name__ == "__main__":
    job._input = _faulty(sys.argv[1])
    sys.exit(cli.main(sys.argv[2:]))
