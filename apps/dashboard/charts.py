"""Small server-side SVG charts: no chart library, no script, readable without CSS colours.

Every chart is an ``<svg role="img">`` with a ``<title>``; its look comes from the ``chart__*``
classes in dashboard.css. Values may be None (a gap in a line). Pure functions of their inputs.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

Number = float | int
XValue = datetime | Number

WIDTH, HEIGHT = 560, 220
PAD_LEFT, PAD_RIGHT, PAD_TOP, PAD_BOTTOM = 52, 14, 26, 30


@dataclass(frozen=True)
class ChartMarker:
    """A vertical line at ``x`` (a version change), labelled on top."""

    x: XValue
    label: str
    title: str = ""


def _num(x: XValue) -> float:
    return x.timestamp() if isinstance(x, datetime) else float(x)


def nice_ticks(low: float, high: float, count: int = 4) -> list[float]:
    """Round tick values covering [low, high] (1, 2, 2.5 or 5 times a power of ten apart)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return [0.0]
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    start = math.floor(low / step) * step
    ticks, value = [], start
    while value <= high + step * 1e-9:
        ticks.append(round(value, 12))
        value += step
    if ticks[-1] < high:
        ticks.append(round(value, 12))
    return ticks


def format_number(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}".rstrip("0").rstrip(".")
    return f"{value:.3g}"


def _svg_open(chart_id: str, title: str, width: int, height: int, css: str) -> str:
    return (
        f'<svg class="chart {css}" viewBox="0 0 {width} {height}" role="img" aria-labelledby="{chart_id}-t" '
        f'preserveAspectRatio="xMidYMid meet" xmlns="http://www.w3.org/2000/svg">'
        f'<title id="{chart_id}-t">{escape(title)}</title>'
    )


def line_chart(
    points: Sequence[tuple[XValue, Number | None]],
    *,
    title: str,
    markers: Sequence[ChartMarker] = (),
    x_format: Callable[[Any], str] = str,
    y_format: Callable[[float], str] = format_number,
    y_min: float | None = None,
    y_max: float | None = None,
    x_max: XValue | None = None,
    empty_text: str = "No data in this range",
) -> SafeString:
    """A line over ``points`` (x ascending), broken where y is None, with dots when points are few,
    and a dashed vertical line for each marker inside the x range (which ``x_max`` may extend
    past the last point: the current, unfinished bucket)."""
    chart_id = f"c{uuid.uuid4().hex[:8]}"
    out = [_svg_open(chart_id, title, WIDTH, HEIGHT, "chart--line")]
    plot_w, plot_h = WIDTH - PAD_LEFT - PAD_RIGHT, HEIGHT - PAD_TOP - PAD_BOTTOM
    finite = [float(y) for _, y in points if y is not None and math.isfinite(float(y))]
    if not points:
        out.append(f'<text class="chart__empty" x="{WIDTH / 2}" y="{HEIGHT / 2}">{escape(empty_text)}</text></svg>')
        return mark_safe("".join(out))
    xs = [_num(x) for x, _ in points]
    x_lo, x_hi = xs[0], max(xs[-1], _num(x_max)) if x_max is not None else xs[-1]
    if x_hi <= x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1
    lo = min(finite) if finite else 0.0
    hi = max(finite) if finite else 1.0
    lo = min(lo, y_min) if y_min is not None else lo
    hi = max(hi, y_max) if y_max is not None else hi
    ticks = nice_ticks(lo, hi)
    y_lo, y_hi = ticks[0], ticks[-1]

    def sx(x: float) -> float:
        return PAD_LEFT + (x - x_lo) / (x_hi - x_lo) * plot_w

    def sy(y: float) -> float:
        return PAD_TOP + plot_h - (y - y_lo) / ((y_hi - y_lo) or 1.0) * plot_h

    for tick in ticks:
        y = sy(tick)
        out.append(f'<line class="chart__grid" x1="{PAD_LEFT}" x2="{WIDTH - PAD_RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(f'<text class="chart__axis chart__axis--y" x="{PAD_LEFT - 6}" y="{y + 4:.1f}">')
        out.append(f"{escape(y_format(tick))}</text>")
    for index in _x_tick_indexes(len(points)):
        x = sx(xs[index])
        anchor = "start" if index == 0 else "end" if index == len(points) - 1 else "middle"
        out.append(
            f'<text class="chart__axis chart__axis--x" x="{x:.1f}" y="{HEIGHT - 8}" text-anchor="{anchor}">'
            f"{escape(x_format(points[index][0]))}</text>"
        )
    for marker in markers:
        mx = _num(marker.x)
        if not x_lo <= mx <= x_hi:
            continue
        x = sx(mx)
        out.append(
            f'<g class="chart__marker"><title>{escape(marker.title or marker.label)}</title>'
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{PAD_TOP - 4}" y2="{PAD_TOP + plot_h}"/>'
            f'<text x="{x:.1f}" y="{PAD_TOP - 8}" text-anchor="middle">{escape(marker.label)}</text></g>'
        )
    if not finite:
        out.append(
            f'<text class="chart__empty" x="{PAD_LEFT + plot_w / 2}" y="{PAD_TOP + plot_h / 2}">'
            f"{escape(empty_text)}</text></svg>"
        )
        return mark_safe("".join(out))
    path, pen_down = [], False
    for x, value in zip(xs, (p[1] for p in points), strict=True):
        if value is None or not math.isfinite(float(value)):
            pen_down = False
            continue
        path.append(f"{'L' if pen_down else 'M'}{sx(x):.1f} {sy(float(value)):.1f}")
        pen_down = True
    out.append(f'<path class="chart__line" d="{" ".join(path)}"/>')
    if len(points) <= 72:
        for x, value in zip(xs, (p[1] for p in points), strict=True):
            if value is not None and math.isfinite(float(value)):
                out.append(f'<circle class="chart__dot" cx="{sx(x):.1f}" cy="{sy(float(value)):.1f}" r="2.5"/>')
    out.append("</svg>")
    return mark_safe("".join(out))


def _x_tick_indexes(n: int, most: int = 5) -> list[int]:
    if n <= 1:
        return [0] if n else []
    if n <= most:
        return list(range(n))
    return sorted({round(i * (n - 1) / (most - 1)) for i in range(most)})


@dataclass(frozen=True)
class Interval:
    """One row of an interval chart: an estimate and its confidence interval."""

    label: str
    low: float
    estimate: float
    high: float


def interval_chart(
    rows: Sequence[Interval], *, title: str, x_format: Callable[[float], str] = format_number
) -> SafeString:
    """Horizontal intervals around a zero line (differences between arms): a row whose interval lies
    wholly right of zero is ``positive``, wholly left ``negative``, else ``neutral``."""
    chart_id = f"c{uuid.uuid4().hex[:8]}"
    row_h, label_w = 34, 150
    height = PAD_TOP + row_h * max(len(rows), 1) + PAD_BOTTOM
    out = [_svg_open(chart_id, title, WIDTH, height, "chart--interval")]
    if not rows:
        out.append(f'<text class="chart__empty" x="{WIDTH / 2}" y="{height / 2}">No data yet</text></svg>')
        return mark_safe("".join(out))
    extent = max(max(abs(r.low), abs(r.high), abs(r.estimate)) for r in rows) or 1.0
    ticks = nice_ticks(-extent, extent)
    lo, hi = ticks[0], ticks[-1]
    x0, plot_w = label_w, WIDTH - label_w - PAD_RIGHT

    def sx(v: float) -> float:
        return x0 + (v - lo) / (hi - lo) * plot_w

    for tick in ticks:
        x = sx(tick)
        css = "chart__zero" if tick == 0 else "chart__grid"
        out.append(f'<line class="{css}" x1="{x:.1f}" x2="{x:.1f}" y1="{PAD_TOP - 6}" y2="{height - PAD_BOTTOM}"/>')
        out.append(
            f'<text class="chart__axis chart__axis--x" x="{x:.1f}" y="{height - 10}" text-anchor="middle">'
            f"{escape(x_format(tick))}</text>"
        )
    for index, row in enumerate(rows):
        y = PAD_TOP + row_h * index + row_h / 2
        kind = "positive" if row.low > 0 else "negative" if row.high < 0 else "neutral"
        out.append(
            f'<g class="chart__interval chart__interval--{kind}"><title>{escape(row.label)}: '
            f"{escape(x_format(row.estimate))} [{escape(x_format(row.low))}, {escape(x_format(row.high))}]</title>"
            f'<text class="chart__label" x="{label_w - 10}" y="{y + 4:.1f}" text-anchor="end">'
            f"{escape(row.label)}</text>"
            f'<rect x="{sx(row.low):.1f}" y="{y - 7:.1f}" width="{max(sx(row.high) - sx(row.low), 1.5):.1f}" '
            f'height="14" rx="3"/><circle cx="{sx(row.estimate):.1f}" cy="{y:.1f}" r="5"/></g>'
        )
    out.append("</svg>")
    return mark_safe("".join(out))


def bar_sparkline(values: Sequence[int | float], *, title: str) -> SafeString:
    """Tiny bars (recent events per minute); the tallest bar fills the height."""
    chart_id = f"c{uuid.uuid4().hex[:8]}"
    width, height = 150, 32
    out = [_svg_open(chart_id, title, width, height, "chart--spark")]
    top = max(values, default=0) or 1
    bar_w = width / max(len(values), 1)
    for index, value in enumerate(values):
        h = max(value / top * (height - 2), 1 if value else 0)
        out.append(
            f'<rect class="chart__bar" x="{index * bar_w + 0.5:.1f}" y="{height - h:.1f}" '
            f'width="{max(bar_w - 1, 1):.1f}" height="{h:.1f}"/>'
        )
    out.append(f'<line class="chart__baseline" x1="0" x2="{width}" y1="{height - 0.5}" y2="{height - 0.5}"/></svg>')
    return mark_safe("".join(out))


def lift_bar(
    low: float | None,
    estimate: float | None,
    high: float | None,
    *,
    kind: str,
    title: str,
    extent: float | None = None,
    x_format: Callable[[float], str] = format_number,
) -> SafeString:
    """One metric's lift (candidate − control) and its interval as a bar around a zero line.

    ``kind`` colours it: ``better`` / ``worse`` (significant, by the metric's polarity) or
    ``none``. The scale is symmetric around zero, ``extent`` wide each side (the interval's own
    reach by default), so the bar shows at a glance which side of zero it lies on."""
    chart_id = f"c{uuid.uuid4().hex[:8]}"
    width, height, pad = 240, 40, 10
    out = [_svg_open(chart_id, title, width, height, f"chart--lift chart--lift-{kind}")]
    mid = width / 2
    if low is None or high is None or estimate is None:  # no zero line to cross the words
        out.append(f'<text class="chart__empty" x="{mid}" y="{height / 2}">not testable yet</text></svg>')
        return mark_safe("".join(out))
    out.append(f'<line class="chart__zero" x1="{mid}" x2="{mid}" y1="2" y2="{height - 12}"/>')
    reach = extent or max(abs(low), abs(high), abs(estimate)) or 1.0
    half = width / 2 - pad

    def sx(v: float) -> float:
        return mid + max(-1.0, min(1.0, v / reach)) * half

    y = height - 2
    out.append(
        f'<text class="chart__axis" x="{pad}" y="{y}" text-anchor="start">{escape(x_format(-reach))}</text>'
        f'<text class="chart__axis" x="{mid}" y="{y}" text-anchor="middle">0</text>'
        f'<text class="chart__axis" x="{width - pad}" y="{y}" text-anchor="end">{escape(x_format(reach))}</text>'
    )
    x_lo, x_hi = sx(low), sx(high)
    out.append(
        f'<rect class="chart__lift-bar" x="{x_lo:.1f}" y="8" width="{max(x_hi - x_lo, 1.5):.1f}" height="12" rx="3"/>'
        f'<circle class="chart__lift-dot" cx="{sx(estimate):.1f}" cy="14" r="4.5"/></svg>'
    )
    return mark_safe("".join(out))


@dataclass(frozen=True)
class BandPoint:
    """An estimate at ``x`` with the band around it (None where it is not defined yet)."""

    x: XValue
    estimate: float | None
    low: float | None
    high: float | None


def band_chart(
    points: Sequence[BandPoint],
    *,
    title: str,
    x_format: Callable[[Any], str] = str,
    y_format: Callable[[float], str] = format_number,
    empty_text: str = "No snapshot yet",
) -> SafeString:
    """A line with a shaded band around it and the zero line: the lift over time inside its
    always-valid confidence sequence (the band may only be trusted where it excludes zero)."""
    chart_id = f"c{uuid.uuid4().hex[:8]}"
    out = [_svg_open(chart_id, title, WIDTH, HEIGHT, "chart--band")]
    usable = [p for p in points if p.estimate is not None and math.isfinite(p.estimate)]
    if not usable:
        out.append(f'<text class="chart__empty" x="{WIDTH / 2}" y="{HEIGHT / 2}">{escape(empty_text)}</text></svg>')
        return mark_safe("".join(out))
    plot_w, plot_h = WIDTH - PAD_LEFT - PAD_RIGHT, HEIGHT - PAD_TOP - PAD_BOTTOM
    values = [0.0] + [v for p in usable for v in (p.estimate, p.low, p.high) if v is not None and math.isfinite(v)]
    ticks = nice_ticks(min(values), max(values))
    y_lo, y_hi = ticks[0], ticks[-1]
    xs = [_num(p.x) for p in usable]
    x_lo, x_hi = xs[0], xs[-1]
    if x_hi <= x_lo:
        x_lo, x_hi = x_lo - 1, x_hi + 1

    def sx(x: float) -> float:
        return PAD_LEFT + (x - x_lo) / (x_hi - x_lo) * plot_w

    def sy(y: float) -> float:
        return PAD_TOP + plot_h - (y - y_lo) / ((y_hi - y_lo) or 1.0) * plot_h

    for tick in ticks:
        y = sy(tick)
        css = "chart__zero" if tick == 0 else "chart__grid"
        out.append(f'<line class="{css}" x1="{PAD_LEFT}" x2="{WIDTH - PAD_RIGHT}" y1="{y:.1f}" y2="{y:.1f}"/>')
        out.append(f'<text class="chart__axis chart__axis--y" x="{PAD_LEFT - 6}" y="{y + 4:.1f}">')
        out.append(f"{escape(y_format(tick))}</text>")
    for index in _x_tick_indexes(len(usable)):
        anchor = "start" if index == 0 else "end" if index == len(usable) - 1 else "middle"
        out.append(
            f'<text class="chart__axis chart__axis--x" x="{sx(xs[index]):.1f}" y="{HEIGHT - 8}" '
            f'text-anchor="{anchor}">{escape(x_format(usable[index].x))}</text>'
        )
    banded = [(x, p) for x, p in zip(xs, usable, strict=True) if p.low is not None and p.high is not None]
    if len(banded) >= 2:
        upper = " ".join(f"{sx(x):.1f},{sy(p.high):.1f}" for x, p in banded)  # type: ignore[arg-type]
        lower = " ".join(f"{sx(x):.1f},{sy(p.low):.1f}" for x, p in reversed(banded))  # type: ignore[arg-type]
        out.append(f'<polygon class="chart__band" points="{upper} {lower}"/>')
    elif banded:
        x, p = banded[0]
        out.append(
            f'<line class="chart__band-line" x1="{sx(x):.1f}" x2="{sx(x):.1f}" '
            f'y1="{sy(p.low):.1f}" y2="{sy(p.high):.1f}"/>'  # type: ignore[arg-type]
        )
    steps = [f"{sx(x):.1f} {sy(p.estimate):.1f}" for x, p in zip(xs, usable, strict=True)]  # type: ignore[arg-type]
    path = "M" + " L".join(steps)
    out.append(f'<path class="chart__line" d="{path}"/>')
    if len(usable) <= 72:
        for x, p in zip(xs, usable, strict=True):
            out.append(f'<circle class="chart__dot" cx="{sx(x):.1f}" cy="{sy(p.estimate):.1f}" r="2.5"/>')  # type: ignore[arg-type]
    out.append("</svg>")
    return mark_safe("".join(out))
