"""apps.common.cache: the shared-client Redis cache and add-or-get, on Redis and on the file cache
of the embedded default."""

from __future__ import annotations

import contextvars
import uuid

import pytest
from django.core.cache import caches

from apps.common.cache import RedisCache, cache_add_or_get


@pytest.fixture(params=["redis", "files"])
def backend(request, settings, tmp_path):
    if request.param == "files":
        settings.CACHES = {
            "default": {"BACKEND": "django.core.cache.backends.filebased.FileBasedCache", "LOCATION": str(tmp_path)}
        }
    cache = caches["default"]
    assert isinstance(cache, RedisCache) == (request.param == "redis")
    return cache


def test_add_or_get_stores_once_and_then_answers_what_is_there(backend):
    key = f"test:add-or-get:{uuid.uuid4().hex}"
    assert cache_add_or_get(key, 1234, timeout_s=5) is None
    assert cache_add_or_get(key, 5678, timeout_s=5) == 1234  # not replaced
    assert backend.get(key) == 1234  # readable through the cache API as well
    backend.delete(key)
    assert cache_add_or_get(key, 5678, timeout_s=5) is None
    backend.delete(key)


def test_add_or_get_reads_a_value_it_cannot_parse_as_zero(backend):
    key = f"test:add-or-get:{uuid.uuid4().hex}"
    backend.set(key, "not a number", timeout=5)
    assert cache_add_or_get(key, 1, timeout_s=5) == 0
    backend.delete(key)


def test_backends_of_separate_requests_share_one_pool_of_connections(settings):
    """Under the ASGI server each request (an async context) gets a cache backend of its own; they
    must share the process's connection pool, not open a connection to Redis per request."""
    if not isinstance(caches["default"], RedisCache):
        pytest.skip("the cache is not Redis here")
    key = f"test:shared-pool:{uuid.uuid4().hex}"

    def in_a_fresh_context() -> tuple[object, object, object]:
        backend = caches["default"]
        assert cache_add_or_get(key, 7, timeout_s=5) in (None, 7)
        return backend, backend._cache.get_client(write=True), backend._cache._get_connection_pool(True)

    first, second = (contextvars.Context().run(in_a_fresh_context) for _ in range(2))
    assert first[0] is not second[0]  # two backends, as two requests get
    assert first[1] is second[1] and first[2] is second[2]  # one client, one pool
    caches["default"].delete(key)
