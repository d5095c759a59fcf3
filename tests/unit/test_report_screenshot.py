"""The report HTML in a real browser: headless Chromium (Debian's `chromium`) renders it,
the plots have drawn content, the added/removed table is there, and a screenshot is
taken: into the test's tmp_path, or into RULES_SCREENSHOT_DIR (RULES_SCREENSHOT_DIR=tests/screenshots
refreshes the approver guide's tests/screenshots/report.png)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
from airflow_fixtures import CHROMIUM, Chromium, chromium_available, png_size

from spark_jobs.report import RuleChange, build_report, load_backtest, write_report

pytestmark = pytest.mark.skipif(
    not chromium_available(), reason=f"headless Chromium not installed at {CHROMIUM} (apt-get install chromium)"
)

RULES = {
    "rapid_clicks": (
        {"rule_id": "rapid_clicks", "version": "1", "rule_type": "velocity", "name": "Rapid clicks per user",
         "source_topic": "events.raw", "group_by": "user_id", "window_size": 10, "window_unit": "seconds",
         "aggregation_type": "count", "threshold": 10, "time_mode": "event_time", "timestamp_field": "timestamp"},
        {"threshold": 8, "version": "2"},
    ),
    "big_purchase": (
        {"rule_id": "big_purchase", "version": "4", "rule_type": "threshold", "name": "Big purchases",
         "source_topic": "events.raw", "conditions": [{"field": "value", "operator": ">=", "value": 500}]},
        {"conditions": [{"field": "value", "operator": ">=", "value": 800}], "version": "5"},
    ),
}


def _write(out: Path, dets: list[dict], evaluated: dict[str, int], versions: dict[str, str]) -> None:
    out.mkdir(parents=True)
    (out / "detections.jsonl").write_text("".join(json.dumps(d) + "\n" for d in dets))
    summary = {
        "rules": {
            rid: {"rule_version": versions[rid], "rule_type": RULES[rid][0]["rule_type"], "events_evaluated": n,
                  "detections": sum(1 for d in dets if d["rule_id"] == rid)}
            for rid, n in evaluated.items()
        },
        "inputs": {"events.raw": {"path": "events.raw.jsonl", "records": 5000, "malformed": 3}},
        "detections": len(dets),
        "dead_letter": 3,
        "duration_s": 21.4,
    }
    (out / "summary.json").write_text(json.dumps(summary))


def _fixture_outputs(tmp: Path) -> tuple[Path, Path]:
    """Two hours of plausible detections: the candidate fires more for rapid_clicks
    (lower threshold) and less for big_purchase (higher amount)."""
    rnd = random.Random(7)
    pub, cand = [], []
    for i in range(120):
        minute = rnd.randrange(0, 120)
        ts = f"2026-01-05T{10 + minute // 60:02d}:{minute % 60:02d}:{rnd.randrange(60):02d}Z"
        if i % 2 == 0:
            n = rnd.randrange(6, 14)
            event = {"type": "click", "user_id": f"u{rnd.randrange(40)}", "n": n, "timestamp": ts}
            base = {**event, "rule_type": "velocity", "aggregation_type": "count", "aggregation_value": n}
            if n >= 10:
                pub.append({**base, "rule_id": "rapid_clicks", "rule_version": "1", "detection_id": f"p{i}"})
            if n >= 8:
                cand.append({**base, "rule_id": "rapid_clicks", "rule_version": "2", "detection_id": f"c{i}"})
        else:
            value = rnd.randrange(400, 1200)
            event = {"type": "purchase", "user_id": f"u{rnd.randrange(40)}", "value": value, "timestamp": ts}
            base = {**event, "rule_type": "threshold"}
            if value >= 500:
                pub.append({**base, "rule_id": "big_purchase", "rule_version": "4", "detection_id": f"p{i}"})
            if value >= 800:
                cand.append({**base, "rule_id": "big_purchase", "rule_version": "5", "detection_id": f"c{i}"})
    _write(tmp / "published", pub, {"rapid_clicks": 2400, "big_purchase": 900}, {"rapid_clicks": "1", "big_purchase": "4"})
    _write(tmp / "candidate", cand, {"rapid_clicks": 2400, "big_purchase": 900}, {"rapid_clicks": "2", "big_purchase": "5"})
    return tmp / "candidate", tmp / "published"


def test_report_renders_plots_and_tables_in_chromium(tmp_path: Path) -> None:
    cand_dir, pub_dir = _fixture_outputs(tmp_path)
    tf = {rid: r.get("timestamp_field") for rid, (r, _) in RULES.items()}
    changes = [RuleChange(rid, {**r, **patch}, r) for rid, (r, patch) in RULES.items()]
    quality = {
        "success": True,
        "failed_expectations": 0,
        "malformed": 3,
        "data_docs": "data_docs/index.html",
        "topics": {
            "events.raw": {
                "path": "history/events.raw.jsonl", "records": 5000, "malformed": 3, "success": True,
                "expectations": [
                    {"description": "the history of this topic is not empty", "success": True},
                    {"description": "timestamp 'timestamp' is set and parseable (for rapid_clicks where type == \"click\")",
                     "success": True, "unexpected_count": 0},
                    {"description": "key field 'user_id' is not null (for rapid_clicks where type == \"click\")",
                     "success": True, "unexpected_count": 0},
                ],
            }
        },
    }
    report = build_report(
        kind="release",
        title="Rule release 3f2c9e1: big_purchase, rapid_clicks",
        candidate=load_backtest(cand_dir, "candidate", tf),
        published=load_backtest(pub_dir, "published", tf),
        rules=changes,
        quality=quality,
        window={"start": "2026-01-04T12:00:00Z", "end": "2026-01-05T12:00:00Z"},
        context={"commit": "3f2c9e1d0a7b", "commit_subject": "Tune click and purchase thresholds",
                 "author": "Rita Author", "base_commit": "9a8b7c6d5e4f", "dag_id": "rule_release",
                 "run_id": "scheduled__2026-01-05T12:00:00+00:00"},
    )
    paths = write_report(report, tmp_path / "report")

    with Chromium(width=1280, height=1000) as browser:
        browser.goto(Path(paths["html"]).as_uri())
        plots = browser.evaluate(
            """Array.from(document.querySelectorAll('svg.plot')).map(svg => {
                 const box = svg.getBoundingClientRect();
                 const marks = Array.from(svg.querySelectorAll('polyline.series, rect.bar'));
                 const drawn = marks.filter(m => { const b = m.getBBox(); return b.width > 0 || b.height > 0; });
                 const lengths = Array.from(svg.querySelectorAll('polyline.series')).map(p => p.getTotalLength());
                 return {w: box.width, h: box.height, marks: marks.length, drawn: drawn.length,
                         longest: Math.max(0, ...lengths), title: svg.getAttribute('aria-label')};
               })"""
        )
        table = browser.evaluate(
            """(() => { const t = document.querySelector('table#added-removed');
                 if (!t) return null;
                 const rows = Array.from(t.querySelectorAll('tbody tr'));
                 return {rows: rows.length, visible: t.getBoundingClientRect().height > 0,
                         added: rows.filter(r => r.classList.contains('added')).length,
                         removed: rows.filter(r => r.classList.contains('removed')).length}; })()"""
        )
        out = Path(os.environ.get("RULES_SCREENSHOT_DIR") or tmp_path)
        shot = browser.screenshot(out / "report.png")

    titles = [p["title"] for p in plots]
    assert "Detections over time: rapid_clicks" in titles and "Detections over time: big_purchase" in titles
    assert "Alerts added / removed by the candidate" in titles
    assert any(t.startswith("Alert rate") for t in titles)
    for p in plots:
        assert p["w"] > 100 and p["h"] > 50, p
        assert p["drawn"] > 0, p  # every plot draws lines or bars with a real size
    for p in plots:
        if p["title"].startswith("Detections over time"):
            assert p["longest"] > 100, p  # a drawn polyline, not a dot
    rows = report["rules"]
    assert table is not None and table["visible"]
    assert table["added"] == sum(r["added"] for r in rows) > 0
    assert table["removed"] == sum(r["removed"] for r in rows) > 0
    width, height = png_size(shot)
    assert width == 1280 and height > 1500
    assert len(shot) > 50_000  # a real rendering, not a blank page
