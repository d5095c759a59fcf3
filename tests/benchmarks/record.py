"""Where a benchmark's figures go: one JSON line per run in tests/benchmarks/results.jsonl,
with what it takes to trace them: the date, the project commit (and whether the work tree
had changes), the CPU model, the cores, the load averages, the command that ran.

    from record import append_result
    append_result("backtest", {"events_per_s": 41000.0, ...}, label="...")

docs/benchmarks.md shows these rows (tests/benchmarks/report.py writes its tables).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results.jsonl"


def machine() -> dict:
    """The CPU model and the number of cores of this machine."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        cpuinfo = []
    cpu = next((line.split(":", 1)[1].strip() for line in cpuinfo if line.startswith("model name")), "unknown")
    return {"cpu_model": cpu, "cores": os.cpu_count()}


def load() -> list[float]:
    """The 1, 5 and 15 minute load averages."""
    return [round(x, 2) for x in os.getloadavg()]


def project_commit() -> dict:
    """The commit of this checkout and whether its tracked files differ from it."""
    def git(*args: str) -> str | None:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    changes = git("status", "--porcelain", "--untracked-files=no")
    return {"project_commit": commit, "dirty": bool(changes)} if commit else {"project_commit": None}


def command() -> str:
    """The command that ran, from the repository root (how to get the figures again)."""
    script = Path(sys.argv[0]).resolve()
    shown = script.relative_to(ROOT) if script.is_relative_to(ROOT) else script
    return shlex.join([".venv/bin/python", str(shown), *sys.argv[1:]])


def append_result(bench: str, figures: dict, *, results: Path = RESULTS, **context) -> dict:
    """Appends one run's figures (and `context`: label, inputs, ...; it may set date,
    load_avg, project_commit or command itself) as one JSON line; returns the line's object."""
    clash = set(figures) & (set(context) | {"bench"})
    if clash:
        raise ValueError(f"figure names that are context names: {sorted(clash)}")
    row = {"bench": bench, "date": datetime.now(UTC).isoformat(timespec="seconds"), **project_commit(),
           **machine(), "load_avg": load(), "command": command(), **context, **figures}
    results.parent.mkdir(parents=True, exist_ok=True)
    with results.open("a", encoding="utf-8") as fh:
        fh.write(json.dumps(row, sort_keys=True) + "\n")
    print(f"figures appended to {results}", file=sys.stderr)
    return row
