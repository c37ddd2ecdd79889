"""What the training app adds to /metrics, read at scrape time (registered in apps.py)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from apps.training.models import TrainingRun
from apps.training.selectors import training_run_counts


def training_runs_metrics() -> Iterator[Metric]:
    runs = GaugeMetricFamily("strop_training_runs", "Training runs by state", labels=["state"])
    counts = training_run_counts()
    for state in TrainingRun.Status.values:
        runs.add_metric([state], counts.get(state, 0))
    yield runs
