"""Per-tenant budget of work: a fixed one-minute window counted in Redis.

A request costs one unit; a batch call costs one unit per ``STROP_RATE_LIMIT_ITEMS_PER_UNIT``
items (``batch_units``), and a completion one unit per ``STROP_RATE_LIMIT_TOKENS_PER_UNIT`` tokens
it may generate, ``n`` x ``max_tokens`` as served (``serving_units``): work, not calls, is what
is counted. The budget is the tenant's ``rate_limit_per_minute`` units. A call that costs more
than the whole budget can never pass and is refused as such.

INCR on Redis is atomic, so every API process shares one count per tenant and window; INCRBY and
EXPIRE go in one pipelined round trip on a client shared by the process. Without Redis configured
(the embedded default, one process) the Django cache counts instead.

A process does not ask Redis on every request: it takes the tenant's budget in blocks (INCRBY n)
and spends a block locally, so most requests make no Redis round trip. A block belongs to one
window; beyond what the request itself needs it holds at most ``STROP_RATE_LIMIT_BLOCK`` units
(default 32) and at most a sixteenth of what the tenant had left in the window when it was taken:
far from the limit a process asks once per block, near it every request is counted in Redis, as
without blocks. Redis's count never goes past the limit by what it grants, so a tenant is never
served more than its limit in a window; what it may lose is the unspent part of processes' last
blocks when the window fills (a few units a process, and the part of a refused batch that was
granted, which stays in the process's block for the requests after it). Once Redis's count has
reached the limit, the process refuses what its block cannot cover without asking again.

Redis down: each process counts alone. Refusing every tenant while Redis restarts would stop
ingest, which must go on (Redis is never the only copy of anything); serving without any count
would let a runaway client through unlimited. So while Redis does not answer, a process serves a
tenant at most ``limit // STROP_RATE_LIMIT_PROCESSES`` units a window (at least one), counting
everything it served in that window, blocks included. The default of 1 process gives every
process the tenant's whole limit: an outage admits at most (API processes x limit) a minute,
never more; set it to the number of API processes for a bound near the limit itself, knowing
that a load balancer which sends one tenant's requests unevenly then refuses some early.
A short socket timeout bounds what a hung Redis costs, and after a failure the process asks
Redis again only every ``RETRY_S`` seconds, so during an outage requests pay no round trip. Each
process logs one warning when an outage begins and one line when Redis answers again.
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
def redis_client(url: str) -> redis.Redis:
    return redis.Redis.from_url(
        url, socket_timeout=SOCKET_TIMEOUT_S, socket_connect_timeout=SOCKET_TIMEOUT_S, health_check_interval=30
    )


class RedisOutage:
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
                    "Redis is unreachable: rate limits are not enforced across processes until it answers again "
                    "(asked every %.0f s); meanwhile each process counts alone, up to its local share: %s",
                    RETRY_S,
                    exc,
                )

    def answered(self, now: float) -> None:
        if self.since is None:
            return
        with self._lock:
            if self.since is not None:
                logger.info(
                    "Redis answers again after %.0f s: rate limits are enforced across processes", now - self.since
                )
                self.since = None


redis_outage = RedisOutage()


def _count(key: str, taken: int) -> int | None:
    """The key's count after adding ``taken``; None when Redis could not count it."""
    if settings.REDIS_URL:
        now = time.monotonic()
        if redis_outage.skip(now):
            return None
        try:
            pipe = redis_client(settings.REDIS_URL).pipeline(transaction=False)
            pipe.incrby(key, taken)
            pipe.expire(key, WINDOW_S + 5, nx=True)
            count, _ = pipe.execute()
        except redis.RedisError as exc:
            redis_outage.failed(exc, now)
            return None
        redis_outage.answered(now)
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
    left: int  # units this process may still serve without asking Redis
    seen: int  # the tenant's count in Redis when the block was taken, with the block


_blocks: dict[int, _Block] = {}  # tenant id -> its block in this process
_served: dict[int, tuple[int, int]] = {}  # tenant id -> (window, units this process served in it)
_blocks_lock = threading.Lock()
BLOCK_SHARE = 16  # a block is at most this fraction (1/16) of what the tenant had left


def _block_size(limit: int, seen: int) -> int:
    return max(1, min(settings.STROP_RATE_LIMIT_BLOCK, (limit - seen) // BLOCK_SHARE))


def local_limit(limit: int) -> int:
    """What one process serves a tenant in a window while Redis cannot count."""
    return max(1, limit // max(1, settings.STROP_RATE_LIMIT_PROCESSES))


def batch_units(items: int) -> int:
    """What a batch of ``items`` costs: one unit per STROP_RATE_LIMIT_ITEMS_PER_UNIT items, at least one."""
    per_unit = max(1, settings.STROP_RATE_LIMIT_ITEMS_PER_UNIT)
    return max(1, -(-items // per_unit))


def serving_units(n: int, max_tokens: int) -> int:
    """What a completion of ``n`` choices of at most ``max_tokens`` tokens each costs: one unit per
    STROP_RATE_LIMIT_TOKENS_PER_UNIT tokens it may generate, at least one."""
    per_unit = max(1, settings.STROP_RATE_LIMIT_TOKENS_PER_UNIT)
    return max(1, -(-(max(1, n) * max(1, max_tokens)) // per_unit))


@dataclass(frozen=True)
class Work:
    """What a call that costs more than one unit asks for, for the refusal's message: a batch of
    ``items`` items, or a completion of ``n`` x ``max_tokens`` tokens (``items`` 0); ``units`` in all."""

    units: int
    items: int = 0
    n: int = 0
    max_tokens: int = 0

    def describe(self) -> str:
        if self.items:
            per_unit = max(1, settings.STROP_RATE_LIMIT_ITEMS_PER_UNIT)
            rule = "one per item" if per_unit == 1 else f"one per {per_unit} items"
            return f"batch of {self.items} items costs {self.units} ({rule})"
        per_unit = max(1, settings.STROP_RATE_LIMIT_TOKENS_PER_UNIT)
        rule = "one per token" if per_unit == 1 else f"one per {per_unit} tokens"
        return f"completion of n={self.n} x max_tokens={self.max_tokens} costs {self.units} ({rule})"

    def smaller(self) -> str:
        return "send smaller batches" if self.items else "ask for fewer choices (n) or fewer tokens (max_tokens)"


def rate_limit_check(
    tenant: Tenant,
    *,
    cost: int = 1,
    batch: tuple[int, int] | None = None,
    work: Work | None = None,
    now: float | None = None,
) -> None:
    """Charge ``cost`` units of the tenant's budget for this window, or raise RateLimited.

    ``batch``: (items, units) of the batch being charged, or ``work``: what the call asks for, for
    the refusal's message (such a call is charged one unit before its body is read and
    ``units - 1`` after)."""
    limit = tenant.rate_limit_per_minute or settings.STROP_DEFAULT_RATE_LIMIT_PER_MINUTE
    now = time.time() if now is None else now
    window = int(now // WINDOW_S)
    if batch is not None:
        work = Work(units=batch[1], items=batch[0])
    if cost <= 0:
        return
    if (work.units if work else cost) > limit:
        _refuse(tenant, limit, window, now, work=work or Work(units=cost, items=cost), never=True)
    with _blocks_lock:
        block = _current_block(tenant.pk, window, limit)
        if block is not None and block.left >= cost:
            block.left -= cost
            _count_served(tenant.pk, window, cost)
            return
        if block is not None and block.seen >= limit:  # Redis's count only grows within a window
            _refuse(tenant, limit, window, now, work=work)
        seen = block.seen if block is not None else 0
        have = 0
        if block is not None:  # what the block still holds goes to this request; reserved meanwhile
            have, block.left = block.left, 0
    size = (cost - have) + _block_size(limit, seen) - 1
    count = _count(f"strop:rl:{tenant.pk}:{window}", size)
    with _blocks_lock:
        if count is None:  # Redis could not count it: this process counts alone
            _local_check(tenant, limit, window, now, cost=cost, work=work, returned=have)
            return
        granted = max(0, min(size, limit - (count - size)))
        served = have + granted >= cost
        block = _current_block(tenant.pk, window, limit)  # another thread may have taken one meanwhile
        left = (block.left if block is not None else 0) + have + granted - (cost if served else 0)
        _blocks[tenant.pk] = _Block(window=window, limit=limit, left=left, seen=count)
        if served:
            _count_served(tenant.pk, window, cost)
            return
    _refuse(tenant, limit, window, now, work=work)


def _count_served(tenant_id: int, window: int, cost: int) -> int:
    """Add ``cost`` to what this process served the tenant in ``window``; the new total."""
    seen_window, units = _served.get(tenant_id, (window, 0))
    units = (units if seen_window == window else 0) + cost
    _served[tenant_id] = (window, units)
    return units


def _local_check(
    tenant: Tenant, limit: int, window: int, now: float, *, cost: int, work: Work | None, returned: int
) -> None:
    """Redis is down: serve ``cost`` only within this process's local share (lock held)."""
    block = _current_block(tenant.pk, window, limit)
    if block is not None:
        block.left += returned  # the reserved part of the block was not spent
    seen_window, units = _served.get(tenant.pk, (window, 0))
    units = units if seen_window == window else 0
    share = local_limit(limit)
    if units + cost > share:
        _refuse(tenant, limit, window, now, work=work, local=share)
    _served[tenant.pk] = (window, units + cost)


def _current_block(tenant_id: int, window: int, limit: int) -> _Block | None:
    """The tenant's block in this process, if it is for this window and this limit."""
    block = _blocks.get(tenant_id)
    return block if block is not None and block.window == window and block.limit == limit else None


def _refuse(
    tenant: Tenant,
    limit: int,
    window: int,
    now: float,
    *,
    work: Work | None = None,
    never: bool = False,
    local: int | None = None,
) -> None:
    retry_after = max(1, int((window + 1) * WINDOW_S - now + 0.999))
    message = f"tenant {tenant.slug} is over its limit of {limit} requests per minute"
    details: dict[str, int] = {"limit_per_minute": limit}
    if work is not None:
        details["cost"] = work.units
        if never:
            message = (
                f"a {work.describe()} of tenant {tenant.slug}'s {limit} requests per minute, "
                f"more than the whole limit: {work.smaller()}"
            )
        else:
            message += f": this {work.describe()}"
    if local is not None:
        message += f" (counted by this API process alone while Redis is unreachable: at most {local})"
        details["local_limit_per_minute"] = local
    raise RateLimited(message, retry_after_s=None if never else retry_after, details=details)
