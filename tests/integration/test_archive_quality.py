"""The event archive as the history of checks and reports: the Great Expectations suite
run by GX's Spark datasource on a DataFrame of the table judges records exactly as the
pandas run over files does, and the daily report reads the table (its backtest and its
data-quality section)."""

from __future__ import annotations

import importlib.util
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from archive_harness import write_records

from spark_jobs.archive.table import engine_input, read_window
from spark_jobs.engine.events import with_reasons
from spark_jobs.quality import run_quality
from spark_jobs.quality.spark_runner import run_quality_spark

pytestmark = [pytest.mark.spark]
ROOT = Path(__file__).resolve().parents[2]

# The pandas suite's own cases (tests/unit/test_quality.py), so both runs judge the same.
_spec = importlib.util.spec_from_file_location("unit_test_quality", ROOT / "tests" / "unit" / "test_quality.py")
_tq = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_tq)
RULES, T0, VELOCITY, write_jsonl = _tq.RULES, _tq.T0, _tq.VELOCITY, _tq.write_jsonl


def write_archive(spark, table: Path, topics: dict[str, list[object]], time_field: str = "timestamp") -> datetime:
    """A Delta archive table holding `topics`' records as the archive job writes them
    (broker timestamps a minute ago, offsets in order); returns the broker time."""
    at = datetime.now(UTC) - timedelta(minutes=1)
    write_records(spark, table, [(topic, i, at, (r if isinstance(r, str) else json.dumps(r)).encode())
                                 for topic, recs in topics.items() for i, r in enumerate(recs)], time_field)
    return at


def _frames(spark, table: Path, topics: list[str]) -> dict:
    now = datetime.now(UTC)
    rows = with_reasons(engine_input(read_window(spark, str(table), now - timedelta(hours=1), now, topics)))
    return {t: rows.filter(rows.topic == t) for t in topics}


def _verdicts(result: dict) -> dict:
    # pandas checks a numeric column's dtype at once (no unexpected count), Spark each value.
    return {t: [(e["description"], e["success"], e["unexpected_count"] or 0) for e in q["expectations"]]
            for t, q in result["topics"].items()}


CLEAN = {
    "events.raw": [
        {"type": "purchase", "user": {"id": "u1"}, "value": 5, "ts": "2026-01-05T12:00:01Z"},
        {"type": "purchase", "user": {"id": "u2"}, "value": 7.5, "ts": "2026-01-05T12:00:02Z", "pair": "EURUSD",
         "implied": 1.2},
        {"type": "view", "ts": "2026-01-05T12:00:03Z"},
    ],
    "context.raw": [{"type": "fx", "pair": "EURUSD", "rate": 1.1, "ts": "2026-01-05T11:59:00Z"},
                    {"type": "other", "x": 1}],
}
BAD = {
    "events.raw": [
        {"type": "purchase", "user": {"id": "u1"}, "value": "lots", "ts": "2026-01-05T12:00:00Z"},
        {"type": "purchase", "value": 5, "ts": "2026-01-05T12:00:00Z"},
        {"type": "purchase", "user": {"id": "u3"}, "value": 5, "ts": "noon"},
        {"type": "purchase", "user": {"id": "u4"}, "value": 5, "ts": "2025-01-01T00:00:00Z"},
        "this is not json",
    ],
}


# collect_max_rows 0: GX on Spark; above the window's size: GX's pandas engine on the
# columns Spark derived (what a release does with a small window). Both judge alike.
@pytest.mark.parametrize("collect_max_rows", [0, 1_000_000])
@pytest.mark.parametrize("case,rules", [("clean", RULES), ("bad", [VELOCITY])])
def test_gx_on_spark_over_the_table_judges_as_pandas_over_files(spark, tmp_path, case, rules, collect_max_rows):
    topics = CLEAN if case == "clean" else BAD
    files = {t: write_jsonl(tmp_path / f"{t}.jsonl", recs) for t, recs in topics.items()}
    window = {"events.raw": (T0, T0 + 60_000), "context.raw": (T0 - 600_000, T0 + 60_000)}
    on_files = run_quality(files, rules, window_ms=window)
    write_archive(spark, tmp_path / "table", topics)
    docs = tmp_path / "docs"
    on_table = run_quality_spark(_frames(spark, tmp_path / "table", list(topics)), rules, window_ms=window,
                                 data_docs_dir=docs, source=str(tmp_path / "table"), collect_max_rows=collect_max_rows)
    assert on_table["engine"] == ("great_expectations (spark)" if not collect_max_rows
                                  else "great_expectations (pandas, values read by spark)")
    got, want = _verdicts(on_table), _verdicts(on_files)
    assert got.keys() == want.keys()
    for t in want:
        assert [x for x in got[t] if x not in want[t]] == [x for x in want[t] if x not in got[t]] == [], t
    assert (on_table["success"], on_table["failed_expectations"], on_table["malformed"]) == (
        on_files["success"], on_files["failed_expectations"], on_files["malformed"])
    for t in topics:
        assert on_table["topics"][t]["records"] == on_files["topics"][t]["records"]
    assert (docs / "index.html").is_file()
    if case == "bad":
        failed = [e for e in on_table["topics"]["events.raw"]["expectations"] if not e["success"]]
        assert any("lots" in (e["sample"] or "") for e in failed)


def test_the_daily_report_reads_the_archive_and_its_quality_comes_from_gx_on_spark(spark, tmp_path):
    from spark_jobs.backtest import submit
    from spark_jobs.lifecycle.release import ARCHIVE_INPUT, backtest_args
    from spark_jobs.lifecycle.scheduled import build_scheduled_report, plan_scheduled
    from spark_jobs.lifecycle.settings import resolve_settings
    from spark_jobs.rules.loader import load_rules
    from spark_jobs.rules.model import rule_to_json_dict

    demo = ROOT / "tests" / "data" / "demo"
    table = tmp_path / "archive" / "events"
    write_archive(spark, table, {t: (demo / f"{t}.jsonl").read_text().splitlines()
                                 for t in ("events.raw", "context.raw")})
    live = {lr.rule.rule_id: rule_to_json_dict(lr.rule) for lr in load_rules([ROOT / "rules"]).rules}
    settings = resolve_settings({"state_dir": str(tmp_path / "state"), "archive_table": str(table),
                                 "archive_lookback_hours": 2, "history_inputs": {}}, use_airflow=False)
    plan = plan_scheduled(settings, live, dag_id="backtest_report", run_id="r1", report_key="2026-11-23")
    assert set(plan["inputs"]) == {ARCHIVE_INPUT} and plan["window"]["anchor"] == "archive"
    # A window this small is checked by GX's pandas engine on the columns Spark read.
    assert plan["quality"]["engine"] == "great_expectations (pandas, values read by spark)"
    q = plan["quality"]["topics"]["events.raw"]
    assert q["records"] + q["malformed"] == 158 and q["malformed"] == 2  # two demo lines are not JSON objects

    args = backtest_args(plan["backtest"], plan["inputs"], settings.time_field, settings.sink_topic)
    assert "--history" in args and "--input" not in args
    assert submit.main(args) == 0
    summary = json.loads((Path(plan["backtest"]["out_dir"]) / "summary.json").read_text())
    assert summary["history"]["table"] == str(table)
    assert summary["inputs"]["events.raw"]["records"] == 158 and summary["detections"] > 0

    result = build_scheduled_report(plan, dag_id="backtest_report", run_id="r1")
    report = json.loads(Path(result["json"]).read_text())
    assert report["quality"]["engine"] == plan["quality"]["engine"]
    assert report["window"]["anchor"] == "archive"
    assert sum(result["detections"].values()) == summary["detections"]
