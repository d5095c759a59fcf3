"""`rulectl cluster`: a local Spark standalone cluster (master + workers) in the foreground.

For trying the scale-out on one machine: the master and N workers run from the pyspark
package's `spark-class` until Ctrl-C / SIGTERM; then `rulectl detect --master
spark://HOST:PORT` runs the detection job on it (client mode) and backtests can be sent
to it (`RULES_SPARK_MASTER`). On real hosts run the same master / worker command lines,
one per host (docker/docker-compose.yml).
"""

from __future__ import annotations

import argparse
import sys

from spark_jobs.commands.signals import serve
from spark_jobs.platform.spark_cluster import LocalSparkCluster, SparkClusterError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cluster", help="run a local Spark standalone master + workers until Ctrl-C")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default: 127.0.0.1)")
    p.add_argument("--port", type=int, default=7077, help="the master's port (default: 7077)")
    p.add_argument("--webui-port", type=int, default=8080,
                   help="the master's web UI / JSON port; worker i uses WEBUI_PORT+i (default: 8080)")
    p.add_argument("--workers", type=int, default=2, help="number of workers (default: 2)")
    p.add_argument("--worker-cores", type=int, default=1, help="cores each worker offers (default: 1)")
    p.add_argument("--worker-memory", default="1g", help="memory each worker offers (default: 1g)")
    p.add_argument("--work-dir", default="var/spark", help="logs and the workers' folders (default: var/spark)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.workers < 1:
        print("rulectl cluster: --workers must be at least 1", file=sys.stderr)
        return 2
    cluster = LocalSparkCluster(args.work_dir, workers=args.workers, host=args.host, port=args.port,
                                webui_port=args.webui_port, worker_cores=args.worker_cores,
                                worker_memory=args.worker_memory)
    return serve(
        "rulectl cluster", cluster, (SparkClusterError,),
        lambda: [f"spark master {cluster.master_url} (UI {cluster.ui_url}), {len(cluster.workers)} workers "
                 f"(logs in {cluster.work_dir})", f"run the job on it: rulectl detect --master {cluster.master_url}"],
        lambda: None if cluster.master.alive() else "the master exited unexpectedly",
        "cluster",
    )
