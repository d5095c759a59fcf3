"""A mean/std correlation rule's std is the population std of the context in each
primary's lookback, at every edge of it, against an oracle written here with Python's
statistics module."""

from __future__ import annotations

import json
import statistics

import pytest

from spark_jobs.engine.events import RAW_COLUMNS, parse_events
from spark_jobs.engine.pipeline import evaluate
from spark_jobs.rules.model import parse_rule

pytestmark = pytest.mark.spark

RULE = {
    "rule_id": "z", "version": "1", "rule_type": "correlation", "source_topic": "e", "context_topic": "ctx",
    "correlation_key": "u", "window_size": 10, "window_unit": "seconds", "context_resolution": "mean_std",
    "context_value_field": "val", "event_value_field": "val", "timestamp_field": "ts", "metric": "z_score",
    "condition": {"operator": ">", "value": -1000},
}

# Context for key 1 at 0, 1, 1 (same time), 5, 30 s; primaries around every edge of
# their lookback (10 s): at a record's time, 10 s after it, 10.001 s after it. Times
# are ms after T0 (epoch ms: smaller numbers would read as epoch seconds).
T0 = 1_767_225_600_000
CONTEXT = [(0, 1.0), (1000, 4.0), (1000, 6.0), (5000, 2.5), (30000, 9.0)]
PRIMARIES = [0, 999, 1000, 4000, 10000, 10999, 11000, 11001, 15000, 15001, 29999, 30000, 40000, 40001]


def _events(spark):
    raws = [("ctx", {"u": 1, "ts": T0 + ts, "val": v}) for ts, v in CONTEXT]
    raws += [("e", {"u": 1, "ts": T0 + ts, "val": 100.0}) for ts in PRIMARIES]
    rows = [(topic, i, json.dumps(e), None) for i, (topic, e) in enumerate(raws)]
    raw_df = spark.createDataFrame(rows, "topic string, seq long, raw string, proc_ms long").select(*RAW_COLUMNS)
    parsed, _ = parse_events(raw_df)
    return parsed


def _expected_std(t: int) -> float | None:
    seen = [v for ts, v in CONTEXT if t - 10000 <= ts <= t]
    return statistics.pstdev(seen) if seen else None


def test_std_is_the_population_std_of_the_lookback(spark):
    result = evaluate(_events(spark), [parse_rule(RULE)])
    got = {}
    for row in result.detections.select("value").collect():
        d = json.loads(row["value"])
        got[d["ts"] - T0] = d["context"]["std"]
    # z_score: a zero std gives no metric, so no detection.
    expected = {t: _expected_std(t) for t in PRIMARIES if _expected_std(t)}
    assert got.keys() == expected.keys()
    for t, std in expected.items():
        assert abs(got[t] - std) < 1e-12, (t, got[t], std)
