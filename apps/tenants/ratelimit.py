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

A process does not ask Redis on every request: it takes the tenant's budget in blocks (INCRBY n)
and spends a block locally, so most requests make no Redis round trip. A block belongs to one
window and is never more than ``STROP_RATE_LIMIT_BLOCK`` requests (default 32) nor more than a
sixteenth of what the tenant had left in the window when it was taken: far from the limit a
process asks once per block, near it blocks shrink to one request and every request is counted
in Redis, as without blocks. Redis's count never goes past the limit by what it grants, so a
tenant is never served more than its limit in a window; what it may lose is the unspent part of
other processes' last blocks when the window fills (a few requests a process). Once Redis's
count has reached the limit, the process refuses the rest of the window without asking again.
A process holding a block keeps serving from it while Redis is down; the outage shows, and is
logged, when it next needs one.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from dataclasses import dataclass

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


def _count(key: str, taken: int) -> int | None:
    """The key's count after adding ``taken``; None when Redis could not count it."""
    if settings.REDIS_URL:
        now = time.monotonic()
        if _outage.skip(now):
            return None
        try:
            pipe = _redis_client(settings.REDIS_URL).pipeline(transaction=False)
            pipe.incrby(key, taken)
            pipe.expire(key, WINDOW_S + 5, nx=True)
            count, _ = pipe.execute()
        except redis.RedisError as exc:
            _outage.failed(exc, now)
            return None
        _outage.answered(now)
        return int(count)
    cache.add(key, 0, timeout=WINDOW_S + 5)
    try:
        return cache.incr(key, taken)
    except ValueError:  # the key expired between add and incr
        cache.add(key, taken, timeout=WINDOW_S + 5)
        return taken


@dataclass
class _Block:
    """This process's share of one tenant's budget in one window."""

    window: int
    limit: int
    left: int  # requests this process may still serve without asking Redis
    seen: int  # the tenant's count in Redis when the block was taken, with the block


_blocks: dict[int, _Block] = {}  # tenant id -> its block in this process
_blocks_lock = threading.Lock()
BLOCK_SHARE = 16  # a block is at most this fraction (1/16) of what the tenant had left


def _block_size(limit: int, seen: int) -> int:
    return max(1, min(settings.STROP_RATE_LIMIT_BLOCK, (limit - seen) // BLOCK_SHARE))


def rate_limit_check(tenant: Tenant, *, now: float | None = None) -> None:
    limit = tenant.rate_limit_per_minute or settings.STROP_DEFAULT_RATE_LIMIT_PER_MINUTE
    now = time.time() if now is None else now
    window = int(now // WINDOW_S)
    with _blocks_lock:
        block = _current_block(tenant.pk, window, limit)
        if block is not None and block.left > 0:
            block.left -= 1
            return
        if block is not None and block.seen >= limit:  # Redis's count only grows within a window
            _refuse(tenant, limit, window, now)
        seen = block.seen if block is not None else 0
    size = _block_size(limit, seen)
    count = _count(f"strop:rl:{tenant.pk}:{window}", size)
    if count is None:
        return  # Redis could not count it: served uncounted
    granted = max(0, min(size, limit - (count - size)))
    with _blocks_lock:  # another thread may have taken a block meanwhile: keep what is left of it
        block = _current_block(tenant.pk, window, limit)
        left = (block.left if block is not None else 0) + max(0, granted - 1)
        _blocks[tenant.pk] = _Block(window=window, limit=limit, left=left, seen=count)
    if granted == 0:
        _refuse(tenant, limit, window, now)


def _current_block(tenant_id: int, window: int, limit: int) -> _Block | None:
    """The tenant's block in this process, if it is for this window and this limit."""
    block = _blocks.get(tenant_id)
    return block if block is not None and block.window == window and block.limit == limit else None


def _refuse(tenant: Tenant, limit: int, window: int, now: float) -> None:
    retry_after = max(1, int((window + 1) * WINDOW_S - now + 0.999))
    raise RateLimited(
        f"tenant {tenant.slug} is over its limit of {limit} requests per minute",
        retry_after_s=retry_after,
        details={"limit_per_minute": limit},
    )
