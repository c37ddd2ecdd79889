"""apps.common.cache: the shared-client Redis cache and add-or-get, on Redis and on the file cache
of the embedded default."""

from __future__ import annotations

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
