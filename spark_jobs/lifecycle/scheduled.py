"""The scheduled (daily) backtest of the published rule set, kept as a dated report.

It answers "what are the live rules catching, and is that changing?": per-rule alert
volumes over the last window of history, a trend built from the earlier dated reports,
and the data-quality result of the history itself.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

from spark_jobs.lifecycle.release import (
    prepare_history,
    report_dir,
    report_url,
    run_dir,
    write_rules_dir,
)
from spark_jobs.lifecycle.settings import LifecycleSettings
from spark_jobs.report import RuleChange, build_report, load_backtest, write_report

TREND_DAYS = 14


def plan_scheduled(
    settings: LifecycleSettings,
    live_rules: Mapping[str, dict],
    *,
    dag_id: str,
    run_id: str,
    report_key: str,
    interval_end: datetime | None = None,
) -> dict:
    """History check and the backtest of every enabled live rule."""
    work = run_dir(settings, dag_id, run_id)
    rdir = report_dir(settings, dag_id, report_key)
    enabled = {rid: r for rid, r in live_rules.items() if r.get("enabled", True)}
    history = prepare_history(settings, enabled, work=work, data_docs_dir=rdir / "data_docs", interval_end=interval_end)
    rules_dir = write_rules_dir(live_rules, work / "published_rules")
    return {
        **history,
        "settings": settings.to_dict(),
        "report_dir": str(rdir),
        "report_key": report_key,
        "rules": dict(live_rules),
        # On the platform's warm Spark when it has one, as a release's backtests.
        "backtest": {"rules_dir": str(rules_dir), "only": sorted(enabled), "out_dir": str(work / "backtest"),
                     "remote": settings.remote_url()},
    }


def previous_trend(report_root: Path, current_key: str, days: int = TREND_DAYS) -> list[dict]:
    """Detections per rule from earlier dated reports (oldest first)."""
    points = []
    if report_root.is_dir():
        for d in sorted(p for p in report_root.iterdir() if p.is_dir() and p.name < current_key):
            f = d / "report.json"
            if not f.exists():
                continue
            try:
                doc = json.loads(f.read_text(encoding="utf-8"))
            except (OSError, json.JSONDecodeError):
                continue
            points.append(
                {
                    "date": d.name,
                    "detections": {r["rule_id"]: (r.get("candidate") or {}).get("detections", 0) for r in doc.get("rules", [])},
                }
            )
    return points[-(days - 1) :] if days > 1 else []


def build_scheduled_report(plan: Mapping, *, dag_id: str, run_id: str, base_url: str = "") -> dict:
    """Write the dated report; returns paths and the URL."""
    settings = LifecycleSettings.from_dict(plan["settings"])
    rules = plan["rules"]
    tfields = {rid: r.get("timestamp_field") for rid, r in rules.items()}
    ran = bool(plan["backtest"]["only"])
    bt = load_backtest(plan["backtest"]["out_dir"] if ran else None, "rule set", tfields, settings.time_field)
    changes = [RuleChange(rid, rules[rid], rules[rid]) for rid in plan["backtest"]["only"]]
    quality = dict(plan["quality"])
    quality["data_docs"] = "data_docs/index.html"
    key = plan["report_key"]
    rdir = Path(plan["report_dir"])
    trend = previous_trend(rdir.parent, key)
    report = build_report(
        kind="scheduled",
        title=f"Daily backtest of the published rules: {key}",
        candidate=bt,
        published=None,
        rules=changes,
        quality=quality,
        window=plan["window"],
        context={"dag_id": dag_id, "run_id": run_id, "logical_date": key},
        max_rows=settings.report_max_rows,
    )
    report["trend"] = [
        *trend,
        {"date": key, "detections": {r["rule_id"]: (r.get("candidate") or {}).get("detections", 0) for r in report["rules"]}},
    ]
    if not ran:
        report["marks"].append({"level": "info", "text": "No rule is published: nothing was backtested."})
    paths = write_report(report, rdir)
    return {
        **paths,
        "dir": str(rdir),
        "url": report_url(dag_id, run_id, base_url),
        "title": report["title"],
        "quality_ok": bool(quality.get("success")),
        "detections": {r["rule_id"]: (r.get("candidate") or {}).get("detections", 0) for r in report["rules"]},
    }
