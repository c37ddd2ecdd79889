"""The suite must run on the real services, or its other tests prove little."""

from django.conf import settings
from django.core.cache import cache
from django.db import connection


def test_suite_runs_on_postgres_and_redis(db):
    assert connection.vendor == "postgresql"
    assert "RedisCache" in settings.CACHES["default"]["BACKEND"]
    cache.set("strop:test:ping", "pong", 5)
    assert cache.get("strop:test:ping") == "pong"


def test_the_redis_cache_shares_one_client_between_calls_and_threads(db):
    from concurrent.futures import ThreadPoolExecutor

    client = cache._cache.get_client(write=True)
    assert cache._cache.get_client(write=True) is client  # not a new redis.Redis per call
    keys = [f"strop:test:shared:{n}" for n in range(64)]
    cache.delete_many(keys)
    with ThreadPoolExecutor(8) as pool:
        first = list(pool.map(lambda key: cache.add(key, 1, timeout=5), keys))
        again = list(pool.map(lambda key: cache.add(key, 1, timeout=5), keys))
    assert all(first) and not any(again)
    assert cache.get_many(keys) == dict.fromkeys(keys, 1)
    cache.delete_many(keys)
