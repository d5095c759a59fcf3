"""Render a report document (see build.py) as one self-contained HTML file.

No external CSS, fonts, scripts or images: the file is served inside the Airflow UI,
attached to tickets and opened offline, and must look the same everywhere.
"""

from __future__ import annotations

import json
from html import escape
from pathlib import Path

from spark_jobs.report.svg import (
    ADDED_COLOR,
    CANDIDATE_COLOR,
    PUBLISHED_COLOR,
    REMOVED_COLOR,
    Series,
    bar_chart,
    line_chart,
)

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:0;color:#1f2328;background:#f6f8fa}
main{max-width:1180px;margin:0 auto;padding:16px 24px 48px}
h1{font-size:22px;margin:8px 0}h2{font-size:18px;margin:28px 0 8px;border-bottom:1px solid #d0d7de;padding-bottom:4px}
h3{font-size:15px;margin:16px 0 6px}
.meta{color:#57606a;font-size:13px}.meta code{background:#eaeef2;padding:1px 4px;border-radius:4px}
.mark{padding:10px 14px;border-radius:6px;margin:8px 0;font-weight:600}
.mark.error{background:#ffebe9;border:1px solid #ff818266;color:#a40e26}
.mark.warning{background:#fff8c5;border:1px solid #d4a72c66;color:#7d4e00}
.mark.info{background:#ddf4ff;border:1px solid #54aeff66;color:#0a3069}
table{border-collapse:collapse;background:#fff;font-size:13px;margin:6px 0;width:100%}
th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f6f8fa}td.num{text-align:right;font-variant-numeric:tabular-nums}
td.ev{font-family:ui-monospace,Menlo,monospace;font-size:12px;word-break:break-all}
tr.added td.change{color:#1a7f37;font-weight:600}tr.removed td.change{color:#cf222e;font-weight:600}
.plots{display:flex;flex-wrap:wrap;gap:12px}.plots svg{background:#fff;border:1px solid #d0d7de;border-radius:6px}
.plot-title{font-size:13px;font-weight:600;fill:#1f2328}.tick{font-size:10px;fill:#57606a}.legend{font-size:11px;fill:#1f2328}
pre.diff{background:#fff;border:1px solid #d0d7de;padding:8px;font-size:12px;overflow:auto;border-radius:6px}
pre.diff .add{color:#1a7f37;background:#dafbe1;display:block}pre.diff .del{color:#cf222e;background:#ffebe9;display:block}
pre.diff .hunk{color:#8250df;display:block}pre.diff .ctx{display:block}
.badge{display:inline-block;padding:0 6px;border-radius:10px;font-size:12px;font-weight:600}
.badge.pass{background:#dafbe1;color:#1a7f37}.badge.fail{background:#ffebe9;color:#cf222e}
.badge.new{background:#ddf4ff;color:#0969da}.badge.changed{background:#fff8c5;color:#7d4e00}
.badge.unchanged,.badge.removed{background:#eaeef2;color:#57606a}
"""


def _e(v: object) -> str:
    return "" if v is None else escape(str(v))


def _num(v: object) -> str:
    if v is None:
        return "–"
    if isinstance(v, float):
        return f"{v:,.3f}".rstrip("0").rstrip(".")
    if isinstance(v, int):
        return f"{v:,}"
    return escape(str(v))


def _short_label(iso: str | None) -> str:
    if not iso:
        return ""
    return iso[5:16].replace("T", " ")  # MM-DD HH:MM


def _diff_html(text: str) -> str:
    out = []
    for line in text.splitlines():
        cls = ""
        if line.startswith("+") and not line.startswith("+++"):
            cls = "add"
        elif line.startswith("-") and not line.startswith("---"):
            cls = "del"
        elif line.startswith("@@"):
            cls = "hunk"
        out.append(f'<span class="{cls or "ctx"}">{escape(line) or " "}</span>')
    return "".join(out)


def _context_html(report: dict) -> str:
    ctx = report.get("context") or {}
    bits = []
    labels = [
        ("commit", "Commit"),
        ("commit_subject", "Message"),
        ("author", "Author"),
        ("base_commit", "Last published commit"),
        ("branch", "Branch"),
        ("repo", "Repository"),
        ("dag_id", "DAG"),
        ("run_id", "Run"),
        ("logical_date", "Date"),
    ]
    for key, label in labels:
        if ctx.get(key):
            bits.append(f"{label}: <code>{_e(ctx[key])}</code>")
    w = report.get("window") or {}
    bits.append(f"History window: <code>{_e(w.get('start'))}</code> → <code>{_e(w.get('end'))}</code>")
    bits.append(f"Generated: {_e(report.get('generated_at'))}")
    return '<p class="meta">' + " · ".join(bits) + "</p>"


def _rules_table(report: dict) -> str:
    release = report["kind"] == "release"
    head = ["Rule", "Type", "Status"]
    head += ["Published version", "Candidate version"] if release else ["Version"]
    head += ["Detections (published)", "Detections (candidate)"] if release else ["Detections"]
    head += ["Alert rate /1k (published)", "Alert rate /1k (candidate)"] if release else ["Alert rate /1k events"]
    if release:
        head += ["Alerts added", "Alerts removed"]
    rows = []
    for r in report["rules"]:
        c, p = r.get("candidate") or {}, r.get("published") or {}
        cells = [
            f"<td><b>{_e(r['rule_id'])}</b><br><span class='meta'>{_e(r.get('name'))}</span></td>",
            f"<td>{_e(r.get('rule_type'))}</td>",
            f"<td><span class='badge {_e(r['status'])}'>{_e(r['status'])}</span></td>",
        ]
        if release:
            cells += [f"<td>{_e(r.get('published_version')) or '–'}</td>", f"<td>{_e(r.get('candidate_version')) or '–'}</td>"]
            cells += [f"<td class='num'>{_num(p.get('detections'))}</td>", f"<td class='num'>{_num(c.get('detections'))}</td>"]
            cells += [
                f"<td class='num'>{_num(p.get('alert_rate_per_1000'))}</td>",
                f"<td class='num'>{_num(c.get('alert_rate_per_1000'))}</td>",
                f"<td class='num'>{_num(r.get('added'))}</td>",
                f"<td class='num'>{_num(r.get('removed'))}</td>",
            ]
        else:
            cells += [f"<td>{_e(r.get('candidate_version'))}</td>", f"<td class='num'>{_num(c.get('detections'))}</td>"]
            cells += [f"<td class='num'>{_num(c.get('alert_rate_per_1000'))}</td>"]
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return (
        '<table id="rules-summary"><thead><tr>'
        + "".join(f"<th>{h}</th>" for h in head)
        + "</tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table>"
    )


def _plots(report: dict) -> str:
    release = report["kind"] == "release"
    labels = [_short_label(x) for x in report["series"]["labels"]]
    charts = []
    for r in report["rules"]:
        s = report["series"]["rules"].get(r["rule_id"]) or {}
        series = []
        if release and s.get("published") is not None:
            series.append(Series(f"published v{r.get('published_version')}", s["published"], PUBLISHED_COLOR, dashed=True))
        if s.get("candidate") is not None and (r.get("candidate") is not None or not release):
            label = f"candidate v{r.get('candidate_version')}" if release else f"v{r.get('candidate_version')}"
            series.append(Series(label, s["candidate"], CANDIDATE_COLOR))
        charts.append(line_chart(f"Detections over time: {r['rule_id']}", series, labels))
    ids = [r["rule_id"] for r in report["rules"]]
    if release and ids:
        charts.append(
            bar_chart(
                "Alerts added / removed by the candidate",
                ids,
                [
                    Series("added", [r.get("added", 0) for r in report["rules"]], ADDED_COLOR),
                    Series("removed", [r.get("removed", 0) for r in report["rules"]], REMOVED_COLOR),
                ],
            )
        )
    if ids:
        rate_series = []
        if release:
            rate_series.append(
                Series("published", [((r.get("published") or {}).get("alert_rate_per_1000") or 0) for r in report["rules"]], PUBLISHED_COLOR)
            )
        rate_series.append(
            Series(
                "candidate" if release else "rule set",
                [((r.get("candidate") or {}).get("alert_rate_per_1000") or 0) for r in report["rules"]],
                CANDIDATE_COLOR,
            )
        )
        charts.append(bar_chart("Alert rate (alerts per 1,000 events evaluated)", ids, rate_series, value_format="{:,.2f}"))
    trend = report.get("trend") or []
    if len(trend) > 1 and ids:
        palette = ["#1f6feb", "#cf222e", "#2da44e", "#8250df", "#bf8700", "#0a3069", "#57606a"]
        tseries = [
            Series(rid, [float((t.get("detections") or {}).get(rid, 0)) for t in trend], palette[i % len(palette)])
            for i, rid in enumerate(ids[:7])
        ]
        charts.append(line_chart("Daily detections per rule (trend)", tseries, [str(t.get("date")) for t in trend]))
    return '<div class="plots">' + "".join(charts) + "</div>"


def _changes_table(report: dict) -> str:
    rows = []
    for r in report["rules"]:
        ch = (report.get("changes") or {}).get(r["rule_id"]) or {}
        for kind in ("added", "removed"):
            for d in ch.get(kind, []):
                rows.append(
                    f"<tr class='{kind}'><td class='change'>{kind}</td><td>{_e(r['rule_id'])}</td>"
                    f"<td>{_e(d.get('rule_version'))}</td><td>{_e(d.get('event_time'))}</td>"
                    f"<td class='num'>{_num(d.get('value'))}</td><td class='ev'>{_e(d.get('event'))}</td>"
                    f"<td class='ev'>{_e(d.get('detection_id'))}</td></tr>"
                )
            if ch.get(f"{kind}_truncated"):
                rows.append(
                    f"<tr class='{kind}'><td class='change'>{kind}</td><td>{_e(r['rule_id'])}</td>"
                    f"<td colspan='5'>… more rows in report.json / the backtest output</td></tr>"
                )
    if not rows:
        rows.append("<tr><td colspan='7'>The candidate raises exactly the alerts the published version raises.</td></tr>")
    return (
        '<table id="added-removed"><thead><tr><th>Change</th><th>Rule</th><th>Version</th><th>Event time</th>'
        "<th>Value</th><th>Event</th><th>Detection id</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )


def _quality_html(report: dict) -> str:
    q = report.get("quality")
    if not q:
        return "<p>No data-quality checks ran for this report.</p>"
    badge = "<span class='badge pass'>passed</span>" if q.get("success") else "<span class='badge fail'>FAILED</span>"
    parts = [f"<p>Great Expectations suite on the event history: {badge} "]
    if q.get("data_docs"):
        parts.append(f"· <a id='data-docs-link' href='{_e(q['data_docs'])}'>Open the Data Docs</a>")
    parts.append("</p>")
    for topic, t in (q.get("topics") or {}).items():
        tb = "<span class='badge pass'>passed</span>" if t.get("success") else "<span class='badge fail'>FAILED</span>"
        parts.append(
            f"<h3>{_e(topic)} {tb}</h3><p class='meta'>{_num(t.get('records'))} records from <code>{_e(t.get('path'))}</code>"
            f"; {_num(t.get('malformed'))} not JSON objects</p>"
        )
        rows = []
        for x in t.get("expectations", []):
            ok = "<span class='badge pass'>ok</span>" if x.get("success") else "<span class='badge fail'>failed</span>"
            rows.append(
                f"<tr><td>{ok}</td><td>{_e(x.get('description') or x.get('type'))}</td>"
                f"<td class='num'>{_num(x.get('unexpected_count'))}</td><td class='ev'>{_e(x.get('sample'))}</td></tr>"
            )
        parts.append(
            "<table class='quality'><thead><tr><th>Result</th><th>Expectation</th><th>Unexpected</th>"
            "<th>Sample of unexpected values</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
        )
    return "".join(parts)


def _backtests_html(report: dict) -> str:
    rows = []
    for side, s in (report.get("backtests") or {}).items():
        if not s:
            continue
        label = side if report["kind"] == "release" else "rule set"
        inputs = ", ".join(f"{k}: {_num(v.get('records'))} records" for k, v in (s.get("inputs") or {}).items())
        rows.append(
            f"<tr><td>{_e(label)}</td><td class='num'>{_num(s.get('detections'))}</td>"
            f"<td class='num'>{_num(s.get('dead_letter'))}</td><td>{_e(inputs)}</td>"
            f"<td class='num'>{_num(s.get('duration_s'))}</td></tr>"
        )
    if not rows:
        return ""
    return (
        "<h2>Backtest runs</h2><table><thead><tr><th>Run</th><th>Detections</th><th>Dead letters</th>"
        "<th>Inputs</th><th>Duration (s)</th></tr></thead><tbody>" + "".join(rows) + "</tbody></table>"
    )


def render_html(report: dict) -> str:
    """The full HTML page of a report document."""
    release = report["kind"] == "release"
    marks = "".join(f"<div class='mark {_e(m['level'])}'>{_e(m['text'])}</div>" for m in report.get("marks", []))
    body = [
        f"<h1>{_e(report['title'])}</h1>",
        _context_html(report),
        marks,
        "<h2>Rules</h2>",
        _rules_table(report),
        "<h2>Plots</h2>",
        _plots(report),
    ]
    if release:
        body += ["<h2>Alerts added and removed</h2>", _changes_table(report), "<h2>Rule diff</h2>"]
        for r in report["rules"]:
            body.append(f"<h3>{_e(r['rule_id'])}</h3><pre class='diff'>{_diff_html(r.get('diff') or '')}</pre>")
    body += ["<h2>Data quality</h2>", _quality_html(report), _backtests_html(report)]
    data = json.dumps(report, default=str).replace("</", "<\\/")
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<meta name='viewport' content='width=device-width, initial-scale=1'><title>{_e(report['title'])}</title>"
        f"<style>{_CSS}</style></head><body><main>{''.join(body)}</main>"
        f"<script type='application/json' id='report-data'>{data}</script></body></html>"
    )


def write_report(report: dict, out_dir: Path | str) -> dict[str, str]:
    """Write report.json and report.html into `out_dir`; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "report.json"
    html_path = out / "report.html"
    json_path.write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    html_path.write_text(render_html(report), encoding="utf-8")
    return {"json": str(json_path), "html": str(html_path)}
