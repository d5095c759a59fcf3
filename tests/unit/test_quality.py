"""The history expectation suite: derived from the rules, run with Great Expectations 1.x."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_jobs.quality import run_quality, suite_specs, topic_fields
from spark_jobs.quality.suite import parsed_time_column
from spark_jobs.rules.model import parse_rule

VELOCITY = parse_rule(
    {
        "rule_id": "purchase_sum",
        "version": "1",
        "rule_type": "velocity",
        "source_topic": "events.raw",
        "conditions": [{"field": "type", "operator": "==", "value": "purchase"}],
        "group_by": "user.id",
        "aggregation_type": "sum",
        "aggregation_field": "value",
        "window_size": 1,
        "window_unit": "hours",
        "threshold": 100,
        "time_mode": "event_time",
        "timestamp_field": "ts",
    }
)
CORRELATION = parse_rule(
    {
        "rule_id": "fx_dev",
        "version": "1",
        "rule_type": "correlation",
        "source_topic": "events.raw",
        "context_topic": "context.raw",
        "correlation_key": "pair",
        "window_size": 10,
        "window_unit": "minutes",
        "context_resolution": "last",
        "context_value_field": "rate",
        "timestamp_field": "ts",
        "metric": "ratio_deviation",
        "event_value_field": "implied",
        "condition": {"operator": ">", "value": 0.05},
        "context_type_field": "type",
        "context_type_value": "fx",
    }
)
THRESHOLD = parse_rule(
    {
        "rule_id": "big",
        "version": "1",
        "rule_type": "threshold",
        "source_topic": "events.raw",
        "conditions": [{"field": "value", "operator": ">", "value": 1000}],
    }
)
RULES = [VELOCITY, CORRELATION, THRESHOLD]
T0 = 1767614400000  # 2026-01-05T12:00:00Z


def write_jsonl(path: Path, rows: list[object]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def test_fields_come_from_the_rules_and_their_scopes() -> None:
    per = topic_fields(RULES)
    events, context = per["events.raw"], per["context.raw"]
    assert events.required == ["ts", "user.id"]
    uses = {(u.field, u.kind, u.condition_text) for u in events.uses}
    assert ("user.id", "key", 'type == "purchase"') in uses
    assert ("value", "numeric", 'type == "purchase"') in uses
    assert ("implied", "numeric", "pair is set") in uses  # correlation primaries: records with the key
    assert {(u.field, u.kind, u.condition_text) for u in context.uses} == {
        ("ts", "time", 'type == "fx"'),
        ("pair", "key", 'type == "fx"'),
        ("rate", "numeric", 'type == "fx"'),
    }
    assert "big" not in {r for u in events.uses for r in u.rules}  # threshold rules need nothing
    assert topic_fields([VELOCITY.model_copy(update={"enabled": False})]) == {}


def test_specs_are_scoped_and_bounded() -> None:
    specs = suite_specs(topic_fields(RULES)["context.raw"], (T0, T0 + 1000))
    types = [s.type for s in specs]
    assert types[:2] == ["ExpectTableRowCountToBeBetween", "ExpectTableColumnsToMatchSet"]
    between = next(s for s in specs if s.type == "ExpectColumnValuesToBeBetween")
    assert between.kwargs == {
        "column": parsed_time_column("ts"),
        "min_value": T0,
        "max_value": T0 + 1000,
        "row_condition": '`type` == "fx"',
        "condition_parser": "pandas",
    }
    assert "within the history window (for fx_dev where type" in between.description


def test_clean_history_passes_and_builds_data_docs(tmp_path: Path) -> None:
    events = write_jsonl(
        tmp_path / "events.jsonl",
        [
            {"type": "purchase", "user": {"id": "u1"}, "value": 20, "ts": "2026-01-05T12:00:00Z"},
            {"type": "purchase", "user": {"id": "u2"}, "value": 20.5, "ts": T0 + 1000},
            {"type": "view", "ts": "2026-01-05T12:00:01Z"},  # not a purchase: no key needed
            {"type": "quote", "pair": "EURUSD", "implied": 1.2, "ts": "2026-01-05T12:00:01Z"},
        ],
    )
    context = write_jsonl(
        tmp_path / "context.jsonl",
        [{"type": "fx", "pair": "EURUSD", "rate": 1.1, "ts": "2026-01-05T11:59:00Z"}, {"type": "other", "x": 1}],
    )
    docs = tmp_path / "docs"
    res = run_quality(
        {"events.raw": events, "context.raw": context},
        RULES,
        window_ms={"events.raw": (T0, T0 + 60_000), "context.raw": (T0 - 600_000, T0 + 60_000)},
        data_docs_dir=docs,
    )
    failed = [(t, e) for t, q in res["topics"].items() for e in q["expectations"] if not e["success"]]
    assert res["success"], failed
    assert res["topics"]["events.raw"]["records"] == 4
    assert (docs / "index.html").exists()
    assert list(docs.glob("validations/**/*.html"))


def test_bad_history_fails_with_the_reasons(tmp_path: Path) -> None:
    events = write_jsonl(
        tmp_path / "events.jsonl",
        [
            {"type": "purchase", "user": {"id": "u1"}, "value": "lots", "ts": "2026-01-05T12:00:00Z"},  # not a number
            {"type": "purchase", "value": 5, "ts": "2026-01-05T12:00:00Z"},  # no user.id
            {"type": "purchase", "user": {"id": "u3"}, "value": 5, "ts": "noon"},  # unparseable
            {"type": "purchase", "user": {"id": "u4"}, "value": 5, "ts": "2025-01-01T00:00:00Z"},  # out of window
            "this is not json",
        ],
    )
    res = run_quality({"events.raw": events}, [VELOCITY], window_ms=(T0, T0 + 60_000))
    q = res["topics"]["events.raw"]
    assert not res["success"] and not q["success"] and q["malformed"] == 1 and res["malformed"] == 1
    failed = {e["description"].split(" (for")[0]: e for e in q["expectations"] if not e["success"]}
    assert set(failed) == {
        "timestamp 'ts' is set and parseable (ISO-8601 or epoch)",
        "timestamp 'ts' is within the history window",
        "key field 'user.id' is not null",
        "value field 'value' holds numbers",
    }
    assert failed["value field 'value' holds numbers"]["unexpected_count"] == 1
    assert "lots" in failed["value field 'value' holds numbers"]["sample"]
    assert res["failed_expectations"] == 4


def test_missing_required_field_and_empty_topic(tmp_path: Path) -> None:
    events = write_jsonl(tmp_path / "events.jsonl", [{"type": "purchase", "value": 1}])
    empty = write_jsonl(tmp_path / "context.jsonl", [])
    res = run_quality({"events.raw": events, "context.raw": empty}, RULES)
    ev = {e["type"]: e for e in res["topics"]["events.raw"]["expectations"]}
    assert not ev["expect_table_columns_to_match_set"]["success"]
    assert "missing: " in ev["expect_table_columns_to_match_set"]["sample"]
    ctx = {e["type"]: e for e in res["topics"]["context.raw"]["expectations"]}
    assert not ctx["expect_table_row_count_to_be_between"]["success"]


@pytest.mark.parametrize("suffix", [".parquet"])
def test_parquet_history(tmp_path: Path, suffix: str) -> None:
    import pandas as pd

    path = tmp_path / f"events{suffix}"
    pd.DataFrame([{"type": "purchase", "value": 3, "ts": "2026-01-05T12:00:00Z", "user.id": "x"}]).to_parquet(path)
    res = run_quality({"events.raw": path}, [THRESHOLD])
    assert res["success"] and res["topics"]["events.raw"]["records"] == 1
