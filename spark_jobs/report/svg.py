"""Tiny inline-SVG charts for the backtest report.

The report must be one self-contained HTML file that opens anywhere (an Airflow view,
an e-mail attachment, a CI artifact) with no network and no plotting dependency, so
the charts are plain SVG written here: a line chart for detections over time and a
grouped horizontal bar chart for per-rule comparisons.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

CANDIDATE_COLOR = "#1f6feb"
PUBLISHED_COLOR = "#8b949e"
ADDED_COLOR = "#2da44e"
REMOVED_COLOR = "#cf222e"


@dataclass(frozen=True)
class Series:
    label: str
    values: Sequence[float]
    color: str
    dashed: bool = False


def _nice_max(value: float) -> float:
    """Round an axis maximum up to 1, 2 or 5 times a power of ten."""
    if value <= 0:
        return 1.0
    exp = math.floor(math.log10(value))
    for m in (1, 2, 5, 10):
        if m * 10**exp >= value:
            return float(m * 10**exp)
    return float(10 ** (exp + 1))


def _fmt(v: float) -> str:
    if v == int(v):
        return f"{int(v):,}"
    return f"{v:,.2f}"


def line_chart(
    title: str,
    series: Sequence[Series],
    x_labels: Sequence[str],
    *,
    width: int = 560,
    height: int = 220,
    y_label: str = "detections",
) -> str:
    """A multi-series line chart; x positions are evenly spaced buckets."""
    left, right, top, bottom = 48, 12, 28, 44
    pw, ph = width - left - right, height - top - bottom
    n = max((len(s.values) for s in series), default=0)
    ymax = _nice_max(max((max(s.values, default=0) for s in series), default=0))
    parts = [
        f'<svg class="plot line-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
        f'<text x="{left}" y="16" class="plot-title">{escape(title)}</text>',
        f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="#fff" stroke="#d0d7de"/>',
    ]
    for i in range(5):
        y = top + ph - ph * i / 4
        parts.append(f'<line x1="{left}" x2="{left + pw}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eaeef2"/>')
        parts.append(f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end" class="tick">{_fmt(ymax * i / 4)}</text>')
    parts.append(
        f'<text x="12" y="{top + ph / 2:.1f}" transform="rotate(-90 12 {top + ph / 2:.1f})" '
        f'text-anchor="middle" class="tick">{escape(y_label)}</text>'
    )

    def x_at(i: int) -> float:
        return left + (pw * (i + 0.5) / n if n else pw / 2)

    if n:
        step = max(1, math.ceil(n / 6))
        for i in range(0, n, step):
            label = x_labels[i] if i < len(x_labels) else ""
            parts.append(f'<text x="{x_at(i):.1f}" y="{top + ph + 14}" text-anchor="middle" class="tick">{escape(label)}</text>')
    for s in series:
        if not s.values:
            continue
        pts = " ".join(f"{x_at(i):.1f},{top + ph - ph * (v / ymax):.1f}" for i, v in enumerate(s.values))
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        parts.append(
            f'<polyline class="series" data-series="{escape(s.label)}" fill="none" stroke="{s.color}" '
            f'stroke-width="2"{dash} points="{pts}"/>'
        )
        if len(s.values) <= 60:
            for i, v in enumerate(s.values):
                if v:
                    parts.append(
                        f'<circle cx="{x_at(i):.1f}" cy="{top + ph - ph * (v / ymax):.1f}" r="2.5" fill="{s.color}">'
                        f"<title>{escape(s.label)}: {_fmt(v)}</title></circle>"
                    )
    lx = left
    for s in series:
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        parts.append(f'<line x1="{lx}" x2="{lx + 18}" y1="{height - 10}" y2="{height - 10}" stroke="{s.color}" stroke-width="2"{dash}/>')
        parts.append(f'<text x="{lx + 22}" y="{height - 6}" class="legend">{escape(s.label)}</text>')
        lx += 30 + 7 * len(s.label)
    parts.append("</svg>")
    return "".join(parts)


def bar_chart(
    title: str,
    categories: Sequence[str],
    series: Sequence[Series],
    *,
    width: int = 560,
    value_format: str = "{:,.0f}",
) -> str:
    """Grouped horizontal bars: one group per category, one bar per series."""
    left, right, top = 150, 60, 28
    bar_h, gap = 12, 10
    group_h = bar_h * max(len(series), 1) + gap
    height = top + group_h * max(len(categories), 1) + 30
    pw = width - left - right
    vmax = _nice_max(max((max(s.values, default=0) for s in series), default=0))
    parts = [
        f'<svg class="plot bar-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
        f'<text x="8" y="16" class="plot-title">{escape(title)}</text>',
        f'<line x1="{left}" x2="{left}" y1="{top - 4}" y2="{height - 26}" stroke="#d0d7de"/>',
    ]
    for gi, cat in enumerate(categories):
        gy = top + gi * group_h
        parts.append(f'<text x="{left - 6}" y="{gy + group_h / 2:.1f}" text-anchor="end" class="tick">{escape(cat[:24])}</text>')
        for si, s in enumerate(series):
            v = float(s.values[gi]) if gi < len(s.values) else 0.0
            w = max(pw * v / vmax, 1.0 if v else 0.0)
            y = gy + si * bar_h
            parts.append(
                f'<rect class="bar" data-series="{escape(s.label)}" x="{left}" y="{y}" width="{w:.1f}" '
                f'height="{bar_h - 2}" fill="{s.color}"><title>{escape(cat)} {escape(s.label)}: '
                f"{value_format.format(v)}</title></rect>"
            )
            parts.append(f'<text x="{left + w + 4:.1f}" y="{y + bar_h - 3}" class="tick">{value_format.format(v)}</text>')
    lx = left
    for s in series:
        parts.append(f'<rect x="{lx}" y="{height - 18}" width="12" height="10" fill="{s.color}"/>')
        parts.append(f'<text x="{lx + 16}" y="{height - 9}" class="legend">{escape(s.label)}</text>')
        lx += 30 + 7 * len(s.label)
    parts.append("</svg>")
    return "".join(parts)
