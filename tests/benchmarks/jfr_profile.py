"""Where a running JVM spends its CPU, by JDK Flight Recorder's method samples: record
for a while with `jcmd JFR.start`, then count, per thread group, the share of samples
each method is on the stack of (inclusive), for the methods of the packages that say
whose code it is (Spark, the job's JVM code, RocksDB, Kafka, Janino).

A benchmark calls `record(pid, seconds, groups)` around its measurement window; the
result is a dict it can append to its row and print.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from collections import Counter
from pathlib import Path

# Frames from these packages are counted; the JDK's and Scala's own are the ones they call.
FOCUS = ("org.apache.spark.", "ruleplatform.", "org.rocksdb.", "org.apache.kafka.", "org.codehaus.janino.",
         "io.delta.", "org.apache.hadoop.")
_THREAD = re.compile(r'sampledThread = "(.*)" \(javaThreadId')
_FRAME = re.compile(r"^\s+([\w$.<>]+)\(")


def _samples(jfr_file: Path) -> list[tuple[str, list[str]]]:
    text = subprocess.run(["jfr", "print", "--events", "jdk.ExecutionSample", "--stack-depth", "128", str(jfr_file)],
                          capture_output=True, text=True, check=True).stdout
    return parse(text)


def parse(text: str) -> list[tuple[str, list[str]]]:
    """(thread name, methods from the top of the stack down) of each execution sample in
    `jfr print --events jdk.ExecutionSample` output."""
    out: list[tuple[str, list[str]]] = []
    thread, frames, in_stack = "", [], False
    for line in text.splitlines():
        if m := _THREAD.search(line):
            thread = m.group(1)
        elif "stackTrace = [" in line:
            frames, in_stack = [], True
        elif in_stack and line.strip() == "]":
            out.append((thread, frames))
            in_stack = False
        elif in_stack and (m := _FRAME.match(line)):
            frames.append(m.group(1))
    return out


def thread_group(name: str, groups: tuple[tuple[str, str], ...]) -> str:
    """The group of a thread named `name`: the first whose prefix it contains, else "other"."""
    return next((g for prefix, g in groups if prefix in name), "other")


def summarize(samples: list[tuple[str, list[str]]], groups: tuple[tuple[str, str], ...], top: int = 12) -> dict:
    """Per group (thread names containing the prefix; else "other"): its samples, the
    `top` focus methods by the share of its samples they are on the stack of
    ("methods", inclusive: the callers a group's time passes through), and the `top`
    innermost focus methods by the share of its samples they are the first focus frame
    from the top of ("innermost": where in Spark's or the job's own code the time is
    spent, below which only JDK or Scala library frames run)."""
    counts: dict[str, Counter[str]] = {}
    inner: dict[str, Counter[str]] = {}
    totals: Counter[str] = Counter()
    for thread, frames in samples:
        group = thread_group(thread, groups)
        totals[group] += 1
        focus = [f for f in frames if f.startswith(FOCUS)]
        counts.setdefault(group, Counter()).update(set(focus))
        inner.setdefault(group, Counter()).update(focus[:1])

    def shares(c: Counter[str], group: str) -> list[tuple[str, float]]:
        return [(m, round(n / totals[group], 3)) for m, n in c.most_common(top)]

    return {group: {"samples": totals[group], "methods": shares(counts[group], group),
                    "innermost": shares(inner[group], group)}
            for group in sorted(totals, key=totals.__getitem__, reverse=True)}


def record(pid: int, seconds: float, groups: tuple[tuple[str, str], ...], top: int = 12) -> dict:
    """Record JVM `pid` for `seconds` (JFR's `profile` settings) and summarize it."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "profile.jfr"
        subprocess.run(["jcmd", str(pid), "JFR.start", "name=bench", "settings=profile", f"filename={out}"],
                       capture_output=True, check=True)
        time.sleep(seconds)
        subprocess.run(["jcmd", str(pid), "JFR.stop", "name=bench"], capture_output=True, check=True)
        return summarize(_samples(out), groups, top)
