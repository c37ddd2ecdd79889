"""Values that live in the database, the broker or vLLM, read when Prometheus scrapes.

They are the same whichever process answers, so they are read, not counted: a gauge kept by
each process would be summed over processes and over dead ones. Each source is read in one
cheap query or round trip; a source that fails is reported by ``strop_scrape_source_up`` and
the rest of the scrape still answers.

This module knows no domain app: the broker and the processes' last-seen times (``last_seen``)
are read here, and each app registers what it contributes when it loads
(``apps.common.observability.sources``): the interactions and training apps their database
values, the engines app its replicas' health.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator

import redis
from django.conf import settings
from django.utils.module_loading import import_string
from prometheus_client.core import GaugeMetricFamily, Metric

from apps.common.observability.last_seen import processes_last_seen
from apps.common.observability.sources import registered

logger = logging.getLogger(__name__)

# kombu's Redis transport keeps one list per priority step: the queue's name, then name + sep + step.
_PRIORITY_KEYS = ("", "\x06\x163", "\x06\x166", "\x06\x169")

Reader = Callable[[], Iterator[Metric]]


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


def _processes() -> Iterator[Metric]:
    family = GaugeMetricFamily(
        "strop_process_last_seen_timestamp_seconds",
        "Unix time each worker (at its Celery heartbeat) and beat (at its scheduler's tick) was last seen "
        "alive; a process that stopped cleanly is removed, one that died keeps its last time",
        labels=["role", "name"],
    )
    for role, name, seen_at in processes_last_seen():
        family.add_metric([role, name], seen_at)
    yield family


class StropCollector:
    """The broker's queues, when the workers and beat were last seen, and what the apps
    registered, for the ``/metrics`` registry."""

    def sources(self) -> list[tuple[str, list[Reader]]]:
        grouped: dict[str, list[Reader]] = {}
        for source, reader in registered:
            if source is not None:
                grouped.setdefault(source, []).append(import_string(reader))
        return [*grouped.items(), ("broker", [_broker]), ("processes", [_processes])]

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "strop_scrape_source_up", "1 if this scrape could read the source, 0 if it failed", labels=["source"]
        )
        for source, readers in self.sources():
            try:
                families = [family for read in readers for family in read()]
            except Exception as exc:  # one source down must not take the other metrics with it
                logger.warning("metrics: could not read the %s: %s: %s", source, type(exc).__name__, exc)
                up.add_metric([source], 0)
                continue
            if families:
                up.add_metric([source], 1)
                yield from families
        yield up
        for registered_source, reader in registered:
            if registered_source is None:
                yield from import_string(reader)()
