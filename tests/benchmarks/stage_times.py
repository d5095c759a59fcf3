"""Where a streaming query's micro-batch spends its time, stage by stage, from Spark's
event log (bench_detect.py --event-log).

A batch's progress report says how long the batch took (`addBatch`) but not which part
of the plan took it. The event log has every stage's wall time, its tasks' run and CPU
time and the plan's SQL metrics (a stateful operator's "time to update": the time its
tasks spent feeding it rows and running it). The keyed query's batch is one Spark job
of three stages, in this order: the scan (Kafka records -> parse -> key rows, up to the
first shuffle), the first keyed operator, the second; the real-time lane's jobs are
left out (their stages run for the whole real-time batch).
"""

from __future__ import annotations

import contextlib
import json
import statistics
from collections import defaultdict
from pathlib import Path


# Spark settings (spark-defaults.conf) that write an uncompressed event log to a folder.
def event_log_conf(folder: Path) -> str:
    return (f"spark.eventLog.enabled true\nspark.eventLog.dir file://{folder}\n"
            "spark.eventLog.compress false\n")


KEYED_STAGES = ("scan", "first operator", "second operator")
STATE_READ = "RocksDB: read - total of uncompressed bytes read (from memtables/cache/sst) from DB::Get()"
STATE_WRITTEN = "RocksDB: write - total of uncompressed bytes written by DB::{Put(), Delete(), Merge(), Write()}"


def keyed_stage_times(folder: Path, since_ms: int = 0) -> dict[str, dict[str, float]]:
    """Per stage of the keyed query's batches that started at or after `since_ms` (epoch
    ms): median wall ms, mean task run ms and CPU ms (summed over the stage's tasks),
    mean "time to update" ms, mean shuffle records read and written, mean bytes the
    state store read by key and wrote."""
    position: dict[int, int] = {}
    by_stage: dict[str, list[dict[str, float]]] = defaultdict(list)
    for log in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")):
        with log.open(encoding="utf-8") as lines:
            for line in lines:
                e = json.loads(line)
                kind = e.get("Event")
                if kind == "SparkListenerJobStart":
                    description = (e.get("Properties") or {}).get("spark.job.description", "")
                    ids = sorted(e["Stage IDs"])
                    if "threshold-lane" in description or len(ids) != len(KEYED_STAGES) \
                            or e.get("Submission Time", 0) < since_ms:
                        continue
                    position.update({sid: i for i, sid in enumerate(ids)})
                elif kind == "SparkListenerStageCompleted":
                    info = e["Stage Info"]
                    if info["Stage ID"] not in position:
                        continue
                    acc: dict[str, float] = {}
                    for a in info.get("Accumulables", []):
                        with contextlib.suppress(KeyError, TypeError, ValueError):
                            acc[a["Name"]] = float(a["Value"])
                    by_stage[KEYED_STAGES[position[info["Stage ID"]]]].append({
                        "wall_ms": info.get("Completion Time", 0) - info.get("Submission Time", 0),
                        "run_ms": acc.get("internal.metrics.executorRunTime", 0),
                        "cpu_ms": acc.get("internal.metrics.executorCpuTime", 0) / 1e6,
                        "update_ms": acc.get("time to update", 0),
                        "shuffle_read": acc.get("internal.metrics.shuffle.read.recordsRead", 0),
                        "shuffle_written": acc.get("internal.metrics.shuffle.write.recordsWritten", 0),
                        # The state store's bytes moved by gets and by writes (RocksDB's own counts).
                        "state_read_bytes": acc.get(STATE_READ, 0),
                        "state_written_bytes": acc.get(STATE_WRITTEN, 0),
                    })
    out = {}
    for name in KEYED_STAGES:
        stages = by_stage.get(name)
        if not stages:
            continue
        out[name] = {"stages": len(stages), "wall_ms_median": round(statistics.median(s["wall_ms"] for s in stages))}
        for k in ("run_ms", "cpu_ms", "update_ms", "shuffle_read", "shuffle_written", "state_read_bytes",
                  "state_written_bytes"):
            out[name][f"{k}_mean"] = round(statistics.fmean(s[k] for s in stages))
    return out
