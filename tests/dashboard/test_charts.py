from __future__ import annotations

from datetime import UTC, datetime, timedelta

from apps.dashboard.charts import (
    ChartMarker,
    Interval,
    bar_sparkline,
    interval_chart,
    lift_bar,
    line_chart,
    nice_ticks,
)


def test_a_line_breaks_where_values_are_missing():
    svg = line_chart([(0, 1.0), (1, 2.0), (2, None), (3, 1.5), (4, 2.5)], title="t")
    path = svg.split('class="chart__line" d="')[1].split('"')[0]
    assert path.count("M") == 2 and path.count("L") == 2
    assert svg.count('class="chart__dot"') == 4


def test_markers_are_drawn_inside_the_range_only_and_text_is_escaped():
    start = datetime(2026, 1, 1, tzinfo=UTC)
    points = [(start + timedelta(hours=h), 0.5) for h in range(5)]
    markers = [
        ChartMarker(x=start + timedelta(hours=2), label="v2", title="v1 → v2 by <user:1>"),
        ChartMarker(x=start + timedelta(days=3), label="v9"),
    ]
    svg = line_chart(points, title="Rate <&>", markers=markers)
    assert svg.count('class="chart__marker"') == 1 and ">v2</text>" in svg and "v9" not in svg
    assert "Rate &lt;&amp;&gt;" in svg and "&lt;user:1&gt;" in svg
    assert 'role="img"' in svg and "<title" in svg


def test_a_chart_without_values_says_so():
    assert "No requests" in line_chart([(0, None), (1, None)], title="t", empty_text="No requests")
    assert "No data" in line_chart([], title="t")


def test_intervals_around_zero_are_classed_by_their_side():
    svg = interval_chart(
        [Interval("reward", 0.01, 0.03, 0.05), Interval("accept", -0.04, -0.02, -0.01), Interval("p95", -1, 0.5, 2)],
        title="Difference",
    )
    assert "chart__interval--positive" in svg and "chart__interval--negative" in svg
    assert "chart__interval--neutral" in svg and 'class="chart__zero"' in svg


def test_nice_ticks_cover_the_range_in_round_steps():
    assert nice_ticks(0, 1) == [0, 0.25, 0.5, 0.75, 1.0]
    ticks = nice_ticks(-0.37, 0.81)
    assert ticks[0] <= -0.37 and ticks[-1] >= 0.81 and 0 in ticks


def test_sparkline_scales_to_the_tallest_bar():
    svg = bar_sparkline([0, 5, 10], title="per minute")
    assert svg.count('class="chart__bar"') == 3 and 'height="30.0"' in svg


def test_a_lift_bar_with_no_interval_says_so_without_a_zero_line_through_the_words():
    empty = lift_bar(None, None, None, kind="none", title="Accept rate")
    assert "not testable yet" in empty and "chart__zero" not in empty
    assert "chart__zero" in lift_bar(-0.01, 0.02, 0.05, kind="none", title="Accept rate")
