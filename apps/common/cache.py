"""Django's Redis cache, keeping one client per connection pool.

Django's backend builds a new ``redis.Redis`` object for every cache call; on the ingest path
(the training-check debounce on every feedback request) that construction cost more than the
Redis round trip. A client only wraps the pool and is safe to share between threads.
"""

from __future__ import annotations

from typing import Any

from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient


class _SharedClients(RedisCacheClient):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clients: dict[int, Any] = {}

    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        pool = self._get_connection_pool(write)
        client = self._clients.get(id(pool))
        if client is None:
            client = self._clients[id(pool)] = self._client(connection_pool=pool)
        return client


class RedisCache(DjangoRedisCache):
    def __init__(self, server: str, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = _SharedClients

    def add_or_get(self, key: str, value: int, *, timeout_s: float) -> Any:
        """``SET NX GET`` (Redis 7.0 or later): stores ``value`` unless ``key`` is there, in one round
        trip; None when it stored it, else the raw value already there."""
        client = self._cache.get_client(write=True)
        return client.set(self.make_and_validate_key(key), value, nx=True, get=True, px=max(1, int(timeout_s * 1000)))


def cache_add_or_get(key: str, value: int, *, timeout_s: float) -> int | None:
    """Store ``value`` under ``key`` (for ``timeout_s``) unless the key is there: None when it was
    stored, else the value already there (0 when it cannot be read). On Redis one round trip
    (``SET NX GET``, Redis 7.0 or later); elsewhere an add, then a read."""
    backend = caches["default"]
    if isinstance(backend, RedisCache):
        found = backend.add_or_get(key, value, timeout_s=timeout_s)
        return None if found is None else _as_int(found)
    if backend.add(key, value, timeout=timeout_s):
        return None
    return _as_int(backend.get(key, 0))


def _as_int(found: Any) -> int:
    try:
        return int(found)
    except (TypeError, ValueError):  # a value some other writer left
        return 0
