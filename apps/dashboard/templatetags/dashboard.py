"""Template helpers for the dashboard: number formats, SVG charts and query strings."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta
from typing import Any

from django import template
from django.http import HttpRequest
from django.utils.safestring import SafeString

from apps.dashboard import charts
from apps.dashboard.stats import Timeseries

register = template.Library()


@register.filter
def pct(value: float | None, digits: int = 1) -> str:
    """0.4123 → "41.2 %"; None (no denominator) or anything not a number → "–"."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return "–"
    return f"{value * 100:.{digits}f} %"


@register.filter
def percent_figure(share: float) -> str:
    """A share as the percent a person types, exact to a hundredth: 0.005 → "0.5", 0.1 → "10"
    (``pct`` rounds to its digits, and a form prefilled with a rounded share would save that)."""
    return f"{round(share * 100, 2):g}"


@register.filter
def num(value: Any, digits: int = 3) -> str:
    """A float to ``digits`` significant figures; ints and strings unchanged; None → "–"."""
    if value is None or value == "":
        return "–"
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if isinstance(value, int):
        return f"{value:,}"
    if not math.isfinite(value):
        return "–"
    return f"{value:.{digits}g}" if abs(value) < 10**digits else f"{value:,.0f}"


@register.filter
def seconds(value: Any) -> str:
    """A duration in seconds, as people read it: 0.42 s, 12.3 s, 4 min 05 s, 2 h 03 min."""
    if not isinstance(value, int | float) or not math.isfinite(value):
        return "–"
    if value < 60:
        return f"{value:.2g} s" if value < 1 else f"{value:.1f} s"
    minutes, secs = divmod(int(round(value)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


@register.filter
def duration(run: Any) -> str:
    started, finished = getattr(run, "started_at", None), getattr(run, "finished_at", None)
    if started is None or finished is None:
        return "–"
    return seconds((finished - started).total_seconds())


@register.filter
def pretty_json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


@register.filter
def exp(value: Any) -> str:
    """A logprob as a probability."""
    if not isinstance(value, int | float) or not math.isfinite(value):
        return "–"
    return f"{math.exp(value):.3f}"


@register.filter
def get(mapping: Any, key: Any) -> Any:
    return mapping.get(key) if isinstance(mapping, dict) else None


@register.filter
def actor(value: str, labels: dict[str, str] | None) -> str:
    """``user:7`` → ``alice (user:7)`` when the page looked the name up."""
    name = (labels or {}).get(value)
    return f"{name} ({value})" if name else value


@register.simple_tag(takes_context=True)
def query_with(context: dict[str, Any], **changes: Any) -> str:
    """The current query string with ``changes`` applied (pagination keeping the filters)."""
    request: HttpRequest = context["request"]
    query = request.GET.copy()
    for name, value in changes.items():
        if value in (None, ""):
            query.pop(name, None)
        else:
            query[name] = str(value)
    encoded = query.urlencode()
    return f"?{encoded}" if encoded else "?"


def _time_format(kind: str, span: timedelta) -> Any:
    def fmt(moment: datetime) -> str:
        if kind == "minute":
            return moment.strftime("%H:%M")
        if kind == "hour" and span <= timedelta(days=1):
            return moment.strftime("%H:00")
        return moment.strftime("%d %b")

    return fmt


@register.simple_tag
def timeseries_chart(ts: Timeseries, name: str, title: str, kind: str = "number") -> SafeString:
    """One rate of an overview timeseries, with the version changes marked."""
    y_format = (lambda v: f"{v * 100:.0f} %") if kind == "percent" else charts.format_number
    markers = [charts.ChartMarker(x=m.at, label=m.label, title=m.title) for m in ts.markers]
    return charts.line_chart(
        ts.series(name),
        title=title,
        markers=markers,
        x_format=_time_format(ts.range.bucket, ts.range.span),
        x_max=ts.until,
        y_format=y_format,
        y_min=0.0 if kind in ("percent", "count") else None,
        y_max=1.0 if kind == "percent" else None,
        empty_text="No requests in this range",
    )


@register.simple_tag
def step_chart(points: list[tuple[float, float | None]], title: str) -> SafeString:
    return charts.line_chart(points, title=title, x_format=lambda x: f"{x:.0f}", empty_text="No steps recorded")


@register.simple_tag
def sparkline(values: list[int], title: str) -> SafeString:
    return charts.bar_sparkline(values, title=title)


@register.simple_tag
def widget(field: Any) -> SafeString:
    """A form field's widget pointing at its help text and errors (``aria-describedby``)."""
    ids = []
    if field.help_text:
        ids.append(f"{field.auto_id}_helptext")
    if field.errors:
        ids.append(f"{field.auto_id}_error")
    attrs = {"aria-describedby": " ".join(ids)} if ids else {}
    if field.errors:
        attrs["aria-invalid"] = "true"
    return field.as_widget(attrs=attrs)


@register.filter
def label(value: Any) -> str:
    """A stored choice as words: ``not_shown`` → ``not shown``."""
    return str(value).replace("_", " ") if value is not None else "–"


@register.filter
def signed(value: Any, digits: int = 3) -> str:
    """A difference with its sign: +0.0412, −0.12; None → "–"."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return "–"
    text = f"{value:+.{digits}g}"
    return text.replace("-", "−")


@register.filter
def pp(value: Any) -> str:
    """A difference of two shares in percentage points: 0.021 → "+2.1 pp"."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return "–"
    return f"{value * 100:+.1f} pp".replace("-", "−")


@register.filter
def signed_pct(value: Any) -> str:
    """A relative change: 0.12 → "+12.0 %"."""
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        return "–"
    return f"{value * 100:+.1f} %".replace("-", "−")


@register.filter
def decision_label(action: str) -> str:
    """An experiment decision as people read it: ``keep_running`` → "Keep running"."""
    from apps.dashboard.experiment_results import ACTION_LABELS

    return ACTION_LABELS.get(action, action)
