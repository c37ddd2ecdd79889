"""Values that live in the database, the broker or vLLM, read when Prometheus scrapes.

They are the same whichever process answers, so they are read, not counted: a gauge kept by
each process would be summed over processes and over dead ones. Each source is read in one
cheap query or round trip; a source that fails is reported by ``strop_scrape_source_up`` and
the rest of the scrape still answers.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator

import redis
from django.conf import settings
from prometheus_client.core import GaugeMetricFamily, Metric

from apps.interactions.selectors import feedback_pending_counts
from apps.serving.services import vllm_client
from apps.training.models import TrainingRun
from apps.training.selectors import training_run_counts

logger = logging.getLogger(__name__)

# kombu's Redis transport keeps one list per priority step: the queue's name, then name + sep + step.
_PRIORITY_KEYS = ("", "\x06\x163", "\x06\x166", "\x06\x169")
VLLM_PROBE_TIMEOUT_S = 1.0
VLLM_HEALTH_CACHE_S = 5.0


def _database() -> Iterator[Metric]:
    pending = GaugeMetricFamily(
        "strop_feedback_pending",
        "Feedback waiting for its interaction to arrive, by tenant slug",
        labels=["tenant"],
    )
    for tenant, count in sorted(feedback_pending_counts().items()):
        pending.add_metric([tenant], count)
    yield pending
    runs = GaugeMetricFamily("strop_training_runs", "Training runs by state", labels=["state"])
    counts = training_run_counts()
    for state in TrainingRun.Status.values:
        runs.add_metric([state], counts.get(state, 0))
    yield runs


@functools.cache
def _redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)


def _broker() -> Iterator[Metric]:
    url = settings.CELERY_BROKER_URL
    if not url.startswith(("redis://", "rediss://", "unix://")):
        return  # the filesystem broker of the embedded default has no queue to measure cheaply
    names = [queue.name for queue in settings.CELERY_TASK_QUEUES]
    pipe = _redis(url).pipeline(transaction=False)
    for name in names:
        for suffix in _PRIORITY_KEYS:
            pipe.llen(name + suffix)
    lengths = pipe.execute()
    depth = GaugeMetricFamily("strop_celery_queue_length", "Messages waiting in each Celery queue", labels=["queue"])
    for index, name in enumerate(names):
        step = len(_PRIORITY_KEYS)
        depth.add_metric([name], sum(lengths[index * step : (index + 1) * step]))
    yield depth


_vllm_lock = threading.Lock()
_vllm_seen: dict[tuple[str, ...], tuple[float, dict[str, bool]]] = {}


def vllm_health() -> dict[str, bool]:
    """Each replica's ``/health``, probed at most every few seconds per process: Prometheus
    servers scraping in parallel cost one probe, and a dead replica costs at most the timeout."""
    client = vllm_client()
    key = tuple(client.base_urls)
    with _vllm_lock:  # concurrent scrapes wait for one probe instead of each sending their own
        seen = _vllm_seen.get(key)
        if seen is None or time.monotonic() - seen[0] >= VLLM_HEALTH_CACHE_S:
            seen = (time.monotonic(), client.health(timeout=VLLM_PROBE_TIMEOUT_S))
            _vllm_seen[key] = seen
        return seen[1]


class StropCollector:
    """Database, broker and vLLM values for the ``/metrics`` registry."""

    sources: tuple[tuple[str, Callable[[], Iterator[Metric]]], ...] = (("database", _database), ("broker", _broker))

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "strop_scrape_source_up", "1 if this scrape could read the source, 0 if it failed", labels=["source"]
        )
        for source, read in self.sources:
            try:
                families = list(read())
            except Exception as exc:  # one source down must not take the other metrics with it
                logger.warning("metrics: could not read the %s: %s: %s", source, type(exc).__name__, exc)
                up.add_metric([source], 0)
                continue
            if families:
                up.add_metric([source], 1)
                yield from families
        yield up
        replicas = GaugeMetricFamily(
            "strop_vllm_replica_up", "1 if the vLLM replica's /health answered 200, else 0", labels=["replica"]
        )
        for replica, healthy in vllm_health().items():
            replicas.add_metric([replica], 1 if healthy else 0)
        yield replicas
