"""The backtest report: detection diff, time series, report document and HTML."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spark_jobs.report import (
    RuleChange,
    build_report,
    load_backtest,
    render_html,
    rule_diff_text,
    write_report,
)
from spark_jobs.report.data import (
    Detection,
    choose_bucket_ms,
    detection_time_ms,
    diff_detections,
    event_fingerprint,
    time_series,
)
from spark_jobs.report.timeparse import get_path, ms_to_iso, to_epoch_ms

RAPID_V1 = {
    "rule_id": "rapid_clicks",
    "version": "1",
    "rule_type": "velocity",
    "name": "Rapid clicks per user",
    "source_topic": "events.raw",
    "group_by": "user_id",
    "window_size": 10,
    "window_unit": "seconds",
    "aggregation_type": "count",
    "threshold": 10,
    "timestamp_field": "ts",
    "time_mode": "event_time",
    "description": None,
}
RAPID_V2 = {**RAPID_V1, "version": "2", "threshold": 8}


def _det(rule: dict, event: dict, did: str, **extra: object) -> dict:
    return {
        **event,
        "rule_id": rule["rule_id"],
        "rule_version": rule["version"],
        "rule_type": rule["rule_type"],
        "processed": "2026-01-05T13:00:00.000Z",
        "detection_id": did,
        "aggregation_type": "count",
        "aggregation_value": extra.get("value", 10),
    }


def write_backtest(out: Path, rule: dict, events: list[tuple[dict, str]], evaluated: int = 100) -> Path:
    """A hand-written backtest output dir (same layout as `rulectl backtest --out`)."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / "detections.jsonl").open("w") as fh:
        for event, did in events:
            fh.write(json.dumps(_det(rule, event, did)) + "\n")
    summary = {
        "rules": {
            rule["rule_id"]: {
                "rule_version": rule["version"],
                "rule_type": rule["rule_type"],
                "events_evaluated": evaluated,
                "detections": len(events),
                "routed": 0,
            }
        },
        "inputs": {"events.raw": {"path": "x.jsonl", "records": evaluated, "malformed": 0}},
        "detections": len(events),
        "dead_letter": 0,
        "duration_s": 1.5,
    }
    (out / "summary.json").write_text(json.dumps(summary))
    return out


def ev(user: str, minute: int, n: int) -> dict:
    return {"type": "click", "user_id": user, "n": n, "ts": f"2026-01-05T12:{minute:02d}:00Z"}


@pytest.fixture
def release_outputs(tmp_path: Path) -> tuple[Path, Path]:
    shared = ev("u1", 5, 10)
    pub = write_backtest(tmp_path / "published", RAPID_V1, [(shared, "p-1"), (ev("u2", 20, 10), "p-2")])
    cand = write_backtest(
        tmp_path / "candidate",
        RAPID_V2,
        [(shared, "c-1"), (ev("u3", 30, 8), "c-2"), (ev("u4", 40, 8), "c-3")],
    )
    return cand, pub


def test_timestamps_follow_the_design_rules() -> None:
    assert to_epoch_ms("2026-01-05T12:00:00Z") == 1767614400000
    assert to_epoch_ms("2026-01-05T12:00:00") == 1767614400000  # no offset = UTC
    assert to_epoch_ms("2026-01-05T13:00:00+01:00") == 1767614400000
    assert to_epoch_ms(1767614400000) == 1767614400000  # ms above 1e11
    assert to_epoch_ms(1767614400) == 1767614400000  # else seconds
    assert to_epoch_ms("1767614400.5") == 1767614400500
    assert to_epoch_ms("yesterday") is None and to_epoch_ms(None) is None and to_epoch_ms(True) is None
    assert ms_to_iso(1767614400000) == "2026-01-05T12:00:00.000Z"
    assert get_path({"user": {"id": 7}}, "user.id") == 7 and get_path({"user": 1}, "user.id") is None


def test_detection_time_prefers_the_rule_field() -> None:
    rec = {"ts": "2026-01-05T12:00:00Z", "timestamp": 1767618000}
    assert detection_time_ms(rec, "ts", "timestamp") == 1767614400000
    assert detection_time_ms(rec, None, "timestamp") == 1767618000000
    assert detection_time_ms({"ts": "bad"}, "ts", "timestamp") is None


def test_diff_matches_by_id_then_by_event() -> None:
    def d(did: str, fp: str, ms: int = 0) -> Detection:
        return Detection(did, "r", "1", ms, fp, "{}")

    cand = [d("a", "f1"), d("x", "f2"), d("y", "f3"), d("z", "f3")]
    pub = [d("a", "f1"), d("q", "f2"), d("w", "f4")]
    res = diff_detections(cand, pub)
    assert res.common == 2  # "a" by id, f2 by event
    assert sorted(x.detection_id for x in res.added) == ["y", "z"]  # f3 twice: a multiset
    assert [x.detection_id for x in res.removed] == ["w"]


def test_fingerprint_ignores_engine_members() -> None:
    event = {"user_id": "u1", "n": 3}
    a = _det(RAPID_V1, event, "one")
    b = {**_det(RAPID_V2, event, "two"), "aggregation_value": 99, "processed": "later"}
    assert event_fingerprint(a) == event_fingerprint(b)
    assert event_fingerprint(a) != event_fingerprint(_det(RAPID_V1, {**event, "n": 4}, "one"))


def test_buckets_and_series() -> None:
    assert choose_bucket_ms(30 * 60_000) == 60_000
    assert choose_bucket_ms(24 * 3_600_000) == 30 * 60_000
    assert choose_bucket_ms(365 * 86_400_000) == 7 * 86_400_000
    dets = [Detection("a", "r", "1", ms, "f", "") for ms in (0, 59_999, 60_000, 500_000, None)]  # type: ignore[arg-type]
    assert time_series(dets, 0, 60_000, 3) == [2, 1, 0]


def test_rule_diff_ignores_key_order_and_shows_the_change() -> None:
    shuffled = dict(reversed(list(RAPID_V1.items())))
    text = rule_diff_text(RuleChange("rapid_clicks", RAPID_V2, shuffled))
    assert "-threshold: 10" in text and "+threshold: 8" in text
    assert "-version: '1'" in text and "+version: '2'" in text
    assert "rule_type" not in [ln[1:].split(":")[0] for ln in text.splitlines() if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    assert "description" not in text  # unset fields are not noise
    new = rule_diff_text(RuleChange("rapid_clicks", RAPID_V2, None))
    assert "(not published)" in new and "+threshold: 8" in new


def test_release_report_document(release_outputs: tuple[Path, Path]) -> None:
    cand_dir, pub_dir = release_outputs
    tf = {"rapid_clicks": "ts"}
    cand = load_backtest(cand_dir, "candidate", tf)
    pub = load_backtest(pub_dir, "published", tf)
    quality = {"success": False, "failed_expectations": 1, "topics": {}, "malformed": 0}
    report = build_report(
        kind="release",
        title="Rule release abc: rapid_clicks",
        candidate=cand,
        published=pub,
        rules=[RuleChange("rapid_clicks", RAPID_V2, RAPID_V1)],
        quality=quality,
        window={"start": "2026-01-05T00:00:00Z", "end": "2026-01-05T23:59:59Z"},
        context={"commit": "abc"},
    )
    (row,) = report["rules"]
    assert row["status"] == "changed"
    assert (row["published_version"], row["candidate_version"]) == ("1", "2")
    assert (row["added"], row["removed"], row["unchanged_alerts"]) == (2, 1, 1)
    assert row["candidate"]["detections"] == 3 and row["published"]["detections"] == 2
    assert row["candidate"]["alert_rate_per_1000"] == 30.0
    added_times = [a["event_time"] for a in report["changes"]["rapid_clicks"]["added"]]
    assert added_times == ["2026-01-05T12:30:00.000Z", "2026-01-05T12:40:00.000Z"]
    assert report["changes"]["rapid_clicks"]["removed"][0]["detection_id"] == "p-2"
    series = report["series"]["rules"]["rapid_clicks"]
    assert sum(series["candidate"]) == 3 and sum(series["published"]) == 2
    assert len(series["candidate"]) == report["series"]["buckets"] == len(report["series"]["labels"])
    # A failing quality suite marks the report; it does not hide anything.
    assert report["marks"][0]["level"] == "error" and "FAILED" in report["marks"][0]["text"]
    assert report["totals"] == {"candidate_detections": 3, "published_detections": 2, "added": 2, "removed": 1}


def test_new_rule_has_no_published_side(tmp_path: Path, release_outputs: tuple[Path, Path]) -> None:
    cand_dir, _ = release_outputs
    cand = load_backtest(cand_dir, "candidate", {})
    report = build_report(
        kind="release",
        title="t",
        candidate=cand,
        published=load_backtest(None, "published", {}),
        rules=[RuleChange("rapid_clicks", RAPID_V2, None)],
    )
    (row,) = report["rules"]
    assert row["status"] == "new" and row["published"] is None and row["added"] == 3 and row["removed"] == 0
    assert any("every alert is new" in m["text"] for m in report["marks"])


def test_html_is_self_contained_with_plots_and_tables(tmp_path: Path, release_outputs: tuple[Path, Path]) -> None:
    cand_dir, pub_dir = release_outputs
    report = build_report(
        kind="release",
        title="Rule release <script>alert(1)</script>",
        candidate=load_backtest(cand_dir, "candidate", {"rapid_clicks": "ts"}),
        published=load_backtest(pub_dir, "published", {"rapid_clicks": "ts"}),
        rules=[RuleChange("rapid_clicks", RAPID_V2, RAPID_V1)],
        quality={"success": True, "topics": {}, "data_docs": "data_docs/index.html"},
    )
    paths = write_report(report, tmp_path / "out")
    html = Path(paths["html"]).read_text()
    assert json.loads(Path(paths["json"]).read_text())["title"] == report["title"]
    assert html.count("<svg class=\"plot") == 3  # detections over time, added/removed, alert rate
    assert 'id="added-removed"' in html and "class='added'" in html and "class='removed'" in html
    assert "<script>alert(1)</script>" not in html  # escaped
    outside = html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "http://" not in outside and "https://" not in outside  # nothing fetched from outside
    assert "href='data_docs/index.html'" in html
    assert render_html(report) == html


def test_scheduled_report_has_trend_and_no_diff(tmp_path: Path, release_outputs: tuple[Path, Path]) -> None:
    cand_dir, _ = release_outputs
    report = build_report(
        kind="scheduled",
        title="Daily",
        candidate=load_backtest(cand_dir, "rule set", {"rapid_clicks": "ts"}),
        published=None,
        rules=[RuleChange("rapid_clicks", RAPID_V2, RAPID_V2)],
        trend=[{"date": "2026-01-04", "detections": {"rapid_clicks": 5}}, {"date": "2026-01-05", "detections": {"rapid_clicks": 3}}],
    )
    assert report["changes"] == {} and report["rules"][0]["diff"] == ""
    html = render_html(report)
    assert "Daily detections per rule (trend)" in html and 'id="added-removed"' not in html
