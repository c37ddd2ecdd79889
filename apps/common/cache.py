"""Django's Redis cache, keeping one connection pool and one client per server for the process.

Django's backend builds a new ``redis.Redis`` object for every cache call; on the ingest path
(the training-check debounce on feedback requests) that construction cost more than the Redis round
trip. And Django's cache handler keeps a backend per async context: under the ASGI server every
request got a backend, so a connection pool, of its own, and each cache call it made opened a new
connection to Redis (connect, handshake) to send one command. So the pools and their clients belong
to the process, shared by every backend of the same server and options: a client only wraps the
pool and is safe to share between threads, and a pool starts afresh in a forked process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.core.cache import caches
from django.core.cache.backends.redis import RedisCache as DjangoRedisCache
from django.core.cache.backends.redis import RedisCacheClient

# (server, pool class, options) -> (pool, client), for the whole process.
_shared: dict[tuple[str, Any, str], tuple[Any, Any]] = {}
_shared_lock = threading.Lock()


class _SharedClients(RedisCacheClient):
    # Set by RedisCacheClient (private there, so django-stubs does not declare them).
    _servers: list[str]
    _pool_class: Any
    _pool_options: dict[str, Any]
    _client: Any
    _get_connection_pool_index: Callable[[bool], int]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._options_key = repr(sorted((name, repr(value)) for name, value in self._pool_options.items()))

    def _shared(self, write: bool) -> tuple[Any, Any]:
        server = self._servers[self._get_connection_pool_index(write)]
        key = (server, self._pool_class, self._options_key)
        found = _shared.get(key)
        if found is None:
            with _shared_lock:
                found = _shared.get(key)
                if found is None:
                    pool = self._pool_class.from_url(server, **self._pool_options)
                    found = _shared[key] = (pool, self._client(connection_pool=pool))
        return found

    def _get_connection_pool(self, write: bool) -> Any:
        return self._shared(write)[0]

    def get_client(self, key: Any = None, *, write: bool = False) -> Any:
        return self._shared(write)[1]


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
