"""The tenant's stream leases when Redis does not answer: counted by this process alone, and Redis
is asked again only when the rate limit would ask it (one outage view per process), so a hung
Redis costs each stream no wait. The "Redis" here is a socket that accepts and never answers."""

from __future__ import annotations

import socket
import threading

import pytest

from apps.common.exceptions import RateLimited
from apps.serving import admission
from apps.tenants import ratelimit
from apps.tenants.models import Tenant


@pytest.fixture
def hung_redis():
    """``(url, accepted)``: a listener that takes connections and answers nothing; ``accepted``
    counts the connections made to it."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    accepted: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            accepted.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    ratelimit.redis_outage.__init__()  # this process's view of Redis, fresh for this test
    try:
        yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0", accepted
    finally:
        listener.close()
        for conn in accepted:
            conn.close()
        ratelimit.redis_outage.__init__()


def test_a_hung_redis_is_asked_once_then_leases_are_counted_here(hung_redis, settings):
    url, accepted = hung_redis
    settings.REDIS_URL = url
    settings.STROP_SERVING_MAX_STREAMS_PER_TENANT = 3
    tenant = Tenant(pk=10**9 + 7, slug="hung-streams")
    leases = [admission.stream_lease_take(tenant) for _ in range(3)]
    assert all(lease is not None and lease.local for lease in leases)
    with pytest.raises(RateLimited):  # the cap holds on this process's own count
        admission.stream_lease_take(tenant)
    for lease in leases:
        admission.stream_lease_return(lease)
    again = [admission.stream_lease_take(tenant) for _ in range(3)]
    for lease in again:
        admission.stream_lease_return(lease)
    # Ten takes and returns: the first asked Redis and timed out; the rest skipped it (at most one
    # more ask, if the loop outlived the outage's retry interval).
    assert 1 <= len(accepted) <= 2, f"Redis was asked {len(accepted)} times"
