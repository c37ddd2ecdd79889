"""What the interactions app adds to /metrics, read at scrape time (registered in apps.py)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from apps.interactions.selectors import feedback_pending_counts


def feedback_pending_metrics() -> Iterator[Metric]:
    pending = GaugeMetricFamily(
        "strop_feedback_pending",
        "Feedback waiting for its interaction to arrive, by tenant slug",
        labels=["tenant"],
    )
    for tenant, count in sorted(feedback_pending_counts().items()):
        pending.add_metric([tenant], count)
    yield pending
