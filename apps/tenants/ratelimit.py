"""Per-tenant request budget: a fixed one-minute window counted in Redis (the Django cache).

INCR on Redis is atomic, so every API process shares one count per tenant and window.
"""

from __future__ import annotations

import time

from django.conf import settings
from django.core.cache import cache

from apps.common.exceptions import RateLimited
from apps.tenants.models import Tenant

WINDOW_S = 60


def rate_limit_check(tenant: Tenant, *, now: float | None = None) -> None:
    limit = tenant.rate_limit_per_minute or settings.STROP_DEFAULT_RATE_LIMIT_PER_MINUTE
    now = time.time() if now is None else now
    window = int(now // WINDOW_S)
    key = f"strop:rl:{tenant.pk}:{window}"
    cache.add(key, 0, timeout=WINDOW_S + 5)
    try:
        count = cache.incr(key)
    except ValueError:  # the key expired between add and incr
        cache.add(key, 1, timeout=WINDOW_S + 5)
        count = 1
    if count > limit:
        retry_after = max(1, int((window + 1) * WINDOW_S - now + 0.999))
        raise RateLimited(
            f"tenant {tenant.slug} is over its limit of {limit} requests per minute",
            retry_after_s=retry_after,
            details={"limit_per_minute": limit},
        )
