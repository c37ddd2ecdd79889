"""The process's handle on the vLLM replicas of its settings, and their health.

Every caller (serving, adapter loading, experiments' serve-probe, the metrics scrape) takes the
client from :func:`vllm_client`, so one connection pool per process reaches every replica.
"""

from __future__ import annotations

import functools
import threading
import time

from django.conf import settings

from apps.engines.vllm_async import AsyncVLLMClient
from apps.engines.vllm_client import VLLMClient

VLLM_PROBE_TIMEOUT_S = 1.0
VLLM_HEALTH_CACHE_S = 5.0


@functools.cache
def _client(urls: tuple[str, ...], timeout: float, api_key: str, connect_timeout: float) -> VLLMClient:
    return VLLMClient(list(urls), timeout=timeout, api_key=api_key, connect_timeout=connect_timeout)


def vllm_client() -> VLLMClient:
    return _client(tuple(settings.VLLM_BASE_URLS), settings.VLLM_TIMEOUT_S, settings.VLLM_API_KEY,
                   settings.VLLM_CONNECT_TIMEOUT_S)


_health_lock = threading.Lock()
_health_seen: dict[tuple[str, ...], tuple[float, dict[str, bool]]] = {}


def vllm_health() -> dict[str, bool]:
    """Each replica's ``/health``, probed at most every few seconds per process: Prometheus
    servers scraping in parallel cost one probe, and a dead replica costs at most the timeout."""
    client = vllm_client()
    key = tuple(client.base_urls)
    with _health_lock:  # concurrent scrapes wait for one probe instead of each sending their own
        seen = _health_seen.get(key)
        if seen is None or time.monotonic() - seen[0] >= VLLM_HEALTH_CACHE_S:
            seen = (time.monotonic(), client.health(timeout=VLLM_PROBE_TIMEOUT_S))
            _health_seen[key] = seen
        return seen[1]


@functools.cache
def _async_client(urls: tuple[str, ...], timeout: float, api_key: str, connect_timeout: float) -> AsyncVLLMClient:
    return AsyncVLLMClient(list(urls), timeout=timeout, api_key=api_key, connect_timeout=connect_timeout)


def vllm_async_client() -> AsyncVLLMClient:
    """The serving endpoints' client (its connection pool is per event loop)."""
    return _async_client(tuple(settings.VLLM_BASE_URLS), settings.VLLM_TIMEOUT_S, settings.VLLM_API_KEY,
                         settings.VLLM_CONNECT_TIMEOUT_S)
