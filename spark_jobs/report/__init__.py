"""Backtest reports: a JSON document plus one self-contained HTML page with plots.

`build_report` compares a candidate backtest with the published one (release reports)
or summarises the published rule set (scheduled reports); `write_report` writes both
files. See build.py for the document layout.
"""

from spark_jobs.report.build import RuleChange, build_report, rule_diff_text
from spark_jobs.report.data import BacktestOutput, diff_detections, load_backtest
from spark_jobs.report.html import render_html, write_report

__all__ = [
    "BacktestOutput",
    "RuleChange",
    "build_report",
    "diff_detections",
    "load_backtest",
    "render_html",
    "rule_diff_text",
    "write_report",
]
