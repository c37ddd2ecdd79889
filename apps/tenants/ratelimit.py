"""Per-tenant request budget: a fixed one-minute window counted in Redis.

INCR on Redis is atomic, so every API process shares one count per tenant and window; INCR and
EXPIRE go in one pipelined round trip on a client shared by the process. Without Redis (the
embedded default, one process) the Django cache counts instead.
"""

from __future__ import annotations

import functools
import time

import redis
from django.conf import settings
from django.core.cache import cache

from apps.common.exceptions import RateLimited
from apps.tenants.models import Tenant

WINDOW_S = 60


@functools.cache
def _redis_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2, health_check_interval=30)


def _count(key: str) -> int:
    if settings.REDIS_URL:
        pipe = _redis_client(settings.REDIS_URL).pipeline(transaction=False)
        pipe.incr(key)
        pipe.expire(key, WINDOW_S + 5, nx=True)
        count, _ = pipe.execute()
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
    if count > limit:
        retry_after = max(1, int((window + 1) * WINDOW_S - now + 0.999))
        raise RateLimited(
            f"tenant {tenant.slug} is over its limit of {limit} requests per minute",
            retry_after_s=retry_after,
            details={"limit_per_minute": limit},
        )
