"""A platform JVM's start with and without its class-data sharing archive
(spark_jobs/jvm/class_archive.py): a Spark session (a backtest's, an Airflow task's) up
to its first small query, the same for a streaming job's session (the detection job's,
the archive's: its own local file system, so the platform's jar on its class path), and
a Kafka broker up to serving.

Each start runs in its own process, alternating with and without (`RULES_CDS=off`),
`--runs` times each; the figures are medians: wall seconds and the JVM's own CPU
seconds (user + system, from /proc). Writes the archives first if set-up did not.

    .venv/bin/python tests/benchmarks/bench_jvm_start.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from record import ROOT, append_result  # noqa: E402

_SPARK = """
import json, os, time
t = time.time()
from spark_jobs.spark import local_checkpoint_conf, session
s = session("jvm-start") if KIND == "spark" else session("jvm-start", streaming=True, extra=local_checkpoint_conf(None))
s.range(1000).selectExpr("id % 7 as k").groupBy("k").count().collect()
s.createDataFrame([("a", '{"x": 1}')], "t string, raw string").selectExpr("try_parse_json(raw) v").collect()
pid = s.sparkContext._gateway.proc.pid
st = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
print(json.dumps({"wall_s": time.time() - t, "cpu_s": (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK")}))
s.stop()
"""

_BROKER = """
import json, os, time
t = time.time()
from spark_jobs.kafka.broker import EmbeddedBroker, free_port
b = EmbeddedBroker(port=free_port(), topics=["a", "b", "c"]).start()
wall = time.time() - t
st = open(f"/proc/{b.pid}/stat").read().rsplit(")", 1)[1].split()
cpu = (int(st[11]) + int(st[12])) / os.sysconf("SC_CLK_TCK")
b.stop()
print(json.dumps({"wall_s": wall, "cpu_s": cpu}))
"""


def _start(script: str, archive: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "RULES_CDS"}
    if not archive:
        env["RULES_CDS"] = "off"
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    from spark_jobs.jvm.class_archive import KINDS, ensure_archive

    for kind in KINDS:
        ensure_archive(kind)
    figures: dict[str, float] = {}
    for kind, script in (("spark", _SPARK.replace("KIND", "'spark'")),
                         ("streaming", _SPARK.replace("KIND", "'streaming'")), ("broker", _BROKER)):
        runs: dict[bool, list[dict]] = {True: [], False: []}
        for _ in range(args.runs):
            for archive in (True, False):
                runs[archive].append(_start(script, archive))
        for archive, name in ((True, "archive"), (False, "none")):
            for m in ("wall_s", "cpu_s"):
                figures[f"{kind}_{name}_{m}"] = round(statistics.median(r[m] for r in runs[archive]), 2)
        print(f"{kind}: with archive {figures[f'{kind}_archive_wall_s']} s wall, {figures[f'{kind}_archive_cpu_s']} "
              f"CPU s; without {figures[f'{kind}_none_wall_s']} s, {figures[f'{kind}_none_cpu_s']} CPU s")
    append_result("jvm_start", figures, runs=args.runs)


if __name__ == "__main__":
    main()
