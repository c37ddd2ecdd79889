"""The suite must run on the real services, or its other tests prove little."""

from django.conf import settings
from django.core.cache import cache
from django.db import connection


def test_suite_runs_on_postgres_and_redis(db):
    assert connection.vendor == "postgresql"
    assert "RedisCache" in settings.CACHES["default"]["BACKEND"]
    cache.set("strop:test:ping", "pong", 5)
    assert cache.get("strop:test:ping") == "pong"
