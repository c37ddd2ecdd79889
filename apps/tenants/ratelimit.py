"""Per-tenant request budget: a fixed one-minute window counted in Redis.

INCR on Redis is atomic, so every API process shares one count per tenant and window; INCR and
EXPIRE go in one pipelined round trip on a client shared by the process. Without Redis (the
embedded default, one process) the Django cache counts instead.

Redis down fails open: the request is served uncounted. The limit protects the platform from a
runaway client; refusing every tenant's traffic while Redis restarts would stop ingest, which
must go on (Redis is never the only copy of anything). A short socket timeout bounds what a hung
Redis costs, and after a failure the process asks Redis again only every ``RETRY_S`` seconds, so
during an outage requests pay nothing. Each process logs one warning when an outage begins and
one line when Redis answers again, never one per request.
"""

from __future__ import annotations

import functools
import logging
import threading
import time

import redis
from django.conf import settings
from django.core.cache import cache

from apps.common.exceptions import RateLimited
from apps.tenants.models import Tenant

WINDOW_S = 60
SOCKET_TIMEOUT_S = 0.25
RETRY_S = 5.0

logger = logging.getLogger(__name__)


@functools.cache
def _redis_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(
        url, socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=SOCKET_TIMEOUT_S, health_check_interval=30
    )


class _Outage:
    """This process's view of Redis: since when it has not answered, and when to ask it again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.since: float | None = None
        self.retry_at = 0.0

    def skip(self, now: float) -> bool:
        return self.since is not None and now < self.retry_at

    def failed(self, exc: Exception, now: float) -> None:
        with self._lock:
            self.retry_at = now + RETRY_S
            if self.since is None:
                self.since = now
                logger.warning(
                    "rate limits are not enforced until Redis answers again (asked every %.0f s): %s", RETRY_S, exc
                )

    def answered(self, now: float) -> None:
        if self.since is None:
            return
        with self._lock:
            if self.since is not None:
                logger.info("Redis answers again after %.0f s: rate limits are enforced", now - self.since)
                self.since = None


_outage = _Outage()


def _count(key: str) -> int | None:
    """The key's count after this request; None when Redis could not count it."""
    if settings.REDIS_URL:
        now = time.monotonic()
        if _outage.skip(now):
            return None
        try:
            pipe = _redis_client(settings.REDIS_URL).pipeline(transaction=False)
            pipe.incr(key)
            pipe.expire(key, WINDOW_S + 5, nx=True)
            count, _ = pipe.execute()
        except redis.RedisError as exc:
            _outage.failed(exc, now)
            return None
        _outage.answered(now)
        return int(count)
    cache.add(key, 0, timeout=WINDOW_S + 5)
    try:
        return cache.incr(key)
    except ValueError:  # the key expired between add and incr
        cache.add(key, 1, timeout=WINDOW_S + 5)
        return 1


def rate_limit_check(tenant: Tenant, *, now: float | None = None) -> None:
    limit = tenant.rate_limit_per_minute or settings.STROP_DEFAULT_RATE_LIMIT_PER_MINUTE
    now = time.time() if now is None else now
    window = int(now // WINDOW_S)
    count = _count(f"strop:rl:{tenant.pk}:{window}")
    if count is not None and count > limit:
        retry_after = max(1, int((window + 1) * WINDOW_S - now + 0.999))
        raise RateLimited(
            f"tenant {tenant.slug} is over its limit of {limit} requests per minute",
            retry_after_s=retry_after,
            details={"limit_per_minute": limit},
        )
