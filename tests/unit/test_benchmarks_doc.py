"""docs/benchmarks.md shows what tests/benchmarks/results.jsonl holds, and every
benchmark script records its figures there (tests/benchmarks/record.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH_DIR = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH_DIR))
import record  # noqa: E402
import report  # noqa: E402


def test_the_doc_is_what_report_py_writes_from_the_results() -> None:
    doc = report.DOC.read_text(encoding="utf-8")
    assert report.render(doc, report.read_rows()) == doc, (
        "docs/benchmarks.md is out of date with tests/benchmarks/results.jsonl: "
        "run .venv/bin/python tests/benchmarks/report.py")


def test_every_script_records_its_figures_and_has_a_section() -> None:
    scripts = {p.name for p in BENCH_DIR.glob("bench_*.py")} - {"bench_python_loop.py"}
    assert scripts, BENCH_DIR
    for name in sorted(scripts):
        assert "append_result(" in (BENCH_DIR / name).read_text(encoding="utf-8"), name
    assert {b.script for b in report.BENCHES.values()} == scripts


def test_a_run_is_one_line_with_what_traces_it(tmp_path: Path) -> None:
    results = tmp_path / "results.jsonl"
    record.append_result("backtest", {"events_per_s": 1234, "elapsed_s": 8.1}, results=results, events=10_000)
    record.append_result("backtest", {"events_per_s": 1300, "elapsed_s": 7.7}, results=results, events=10_000)
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(rows) == 2
    for key in ("bench", "date", "project_commit", "cpu_model", "cores", "load_avg", "command", "events"):
        assert key in rows[0], key
    assert len(rows[0]["load_avg"]) == 3 and rows[0]["command"].startswith(".venv/bin/python ")
    with pytest.raises(ValueError, match="events"):
        record.append_result("backtest", {"events": 1}, results=results, events=2)
    # The generated section shows both rows, and a benchmark without rows says how to get some.
    doc = f"intro\n{report.BEGIN}\n{report.END}\nrest\n"
    out = report.render(doc, rows)
    assert out.startswith("intro\n") and out.endswith("\nrest\n")
    assert "| 1,234 |" not in out and "| 1234 |" in out and "| 1300 |" in out
    assert f"No results yet; run `{report.BENCHES['cluster'].command}`." in out
