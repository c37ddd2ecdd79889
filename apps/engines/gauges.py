"""What the engines app adds to /metrics, read at scrape time (registered in apps.py)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from apps.engines.vllm import vllm_health


def vllm_replicas_metrics() -> Iterator[Metric]:
    replicas = GaugeMetricFamily(
        "strop_vllm_replica_up", "1 if the vLLM replica's /health answered 200, else 0", labels=["replica"]
    )
    for replica, healthy in vllm_health().items():
        replicas.add_metric([replica], 1 if healthy else 0)
    yield replicas
