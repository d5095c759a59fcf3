"""spark-submit entry point for the detection job: `rulectl detect` as an application file.

spark-submit needs a Python file, not a console script. Usage (arguments are those of
`rulectl detect`):

    spark-submit --master spark://spark-master:7077 \
      --packages org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0 \
      /opt/rule-platform/docker/detect_submit.py --bootstrap kafka:19092 --checkpoint /checkpoints/detect

The compose file starts the job from Python instead (PYSPARK_SUBMIT_ARGS carries the
same spark-submit options) so that the Python driver is the container's main process and
receives `docker stop`'s SIGTERM for a graceful stop; use this file where a literal
spark-submit is needed (e.g. Airflow's SparkSubmitOperator).
"""

from __future__ import annotations

import sys

from spark_jobs.cli import main

if __name__ == "__main__":
    sys.exit(main(["detect", *sys.argv[1:]]))
