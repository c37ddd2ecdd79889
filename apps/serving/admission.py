"""Backpressure on the serving path: a bounded number of completions at once, never a queue.

- Per API process: at most ``STROP_SERVING_MAX_IN_FLIGHT`` completions (streamed or not) at once,
  never more than the process's pool to vLLM has connections (``ASYNC_MAX_CONNECTIONS``), so an
  admitted completion never waits for one. Past it the process is saturated: ``503 server_busy``
  with ``Retry-After``, at once, so a load balancer or the client tries another replica or later
  instead of waiting in a backlog.
- Per tenant: at most ``STROP_SERVING_MAX_STREAMS_PER_TENANT`` streams at once over every API
  process (0: no cap). Past it, ``429 too_many_streams`` with ``Retry-After``: one tenant's editors
  cannot hold every stream a fleet of API processes has.

The tenant's streams are leases in a Redis sorted set scored by when they lapse: taking one
drops the lapsed ones, adds this one and counts, in one round trip. A lease lapses after
``STROP_SERVING_STREAM_LEASE_S`` if its process died without returning it (a killed worker).
Redis down: each process caps the tenant's streams on its own count, as the rate limit does, and
asks Redis again only when the rate limit would (one outage view per process,
``apps.tenants.ratelimit.redis_outage``): a dead or hung Redis costs a stream no wait.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass

import redis
from django.conf import settings

from apps.common.exceptions import RateLimited, ServerBusy
from apps.engines.vllm_transport import ASYNC_MAX_CONNECTIONS
from apps.tenants.models import Tenant
from apps.tenants.ratelimit import redis_client, redis_outage

logger = logging.getLogger(__name__)

STREAMS_RETRY_AFTER_S = 1

_in_flight = 0  # the event loop's own count: only touched from its thread
_local_streams: Counter[int] = Counter()  # per tenant, while Redis does not answer
_local_lock = threading.Lock()


class TooManyStreams(RateLimited):
    code = "too_many_streams"


def in_flight() -> int:
    return _in_flight


def in_flight_limit() -> int:
    """``STROP_SERVING_MAX_IN_FLIGHT``, at most the connections of the process's pool to vLLM: an
    admitted completion then always finds a free connection, and a full process answers at once
    here instead of waiting for one."""
    return min(settings.STROP_SERVING_MAX_IN_FLIGHT, ASYNC_MAX_CONNECTIONS)


def process_slot_take() -> None:
    """Count one more completion in this process, or refuse it (503) when the process is full."""
    global _in_flight
    limit = in_flight_limit()
    if _in_flight >= limit:
        raise ServerBusy(
            f"this API process is serving its limit of {limit} completions at once; retry shortly",
            details={"limit": limit},
        )
    _in_flight += 1


def process_slot_return() -> None:
    global _in_flight
    _in_flight -= 1


@dataclass
class StreamLease:
    """One of a tenant's concurrent streams; ``local``: counted by this process alone."""

    tenant_id: int
    token: str
    local: bool = False


def _key(tenant_id: int) -> str:
    return f"strop:streams:{tenant_id}"


def stream_lease_take(tenant: Tenant) -> StreamLease | None:
    """A lease on one of the tenant's concurrent streams (None: no cap), or 429 too_many_streams."""
    cap = settings.STROP_SERVING_MAX_STREAMS_PER_TENANT
    if cap <= 0:
        return None
    lease = StreamLease(tenant.pk, uuid.uuid4().hex)
    now = time.time()
    count: int | None = None
    if settings.REDIS_URL and not redis_outage.skip(time.monotonic()):
        key = _key(tenant.pk)
        asked = time.monotonic()
        try:
            pipe = redis_client(settings.REDIS_URL).pipeline(transaction=True)
            pipe.zremrangebyscore(key, "-inf", now)
            pipe.zadd(key, {lease.token: now + settings.STROP_SERVING_STREAM_LEASE_S})
            pipe.zcard(key)
            pipe.expire(key, int(settings.STROP_SERVING_STREAM_LEASE_S) + 60)
            count = int(pipe.execute()[2])
        except redis.RedisError as exc:
            redis_outage.failed(exc, asked)
            logger.warning("stream cap counted by this process alone: Redis did not answer (%s)", exc)
        else:
            redis_outage.answered(asked)
    if count is None:
        lease.local = True
        with _local_lock:
            _local_streams[tenant.pk] += 1
            count = _local_streams[tenant.pk]
    if count > cap:
        stream_lease_return(lease)
        raise TooManyStreams(
            f"the tenant already has {cap} streams open, its limit (STROP_SERVING_MAX_STREAMS_PER_TENANT); "
            "retry when one ends",
            retry_after_s=STREAMS_RETRY_AFTER_S,
            details={"limit": cap},
        )
    return lease


def stream_lease_return(lease: StreamLease | None) -> None:
    if lease is None:
        return
    if lease.local:
        with _local_lock:
            _local_streams[lease.tenant_id] -= 1
        return
    asked = time.monotonic()
    if redis_outage.skip(asked):  # Redis is down: the lease lapses on its own after STROP_SERVING_STREAM_LEASE_S
        return
    try:
        redis_client(settings.REDIS_URL).zrem(_key(lease.tenant_id), lease.token)
    except redis.RedisError as exc:  # it lapses on its own after STROP_SERVING_STREAM_LEASE_S
        redis_outage.failed(exc, asked)
        logger.warning("a stream lease was not returned (Redis did not answer: %s); it lapses by itself", exc)
