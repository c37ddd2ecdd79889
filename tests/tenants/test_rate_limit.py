from __future__ import annotations

import time

import pytest

from apps.common.exceptions import RateLimited

pytestmark = pytest.mark.django_db


def test_tenant_over_its_limit_gets_429_with_retry_after(make_tenant, make_client):
    tenant = make_tenant("limited", rate_limit_per_minute=3)
    client = make_client(tenant)
    assert [client.get("/v1/tenant").status_code for _ in range(3)] == [200, 200, 200]
    response = client.get("/v1/tenant")
    assert response.status_code == 429
    assert 1 <= int(response["Retry-After"]) <= 60
    assert response.json()["error"]["code"] == "rate_limited"


def test_limits_are_per_tenant(make_tenant, make_client):
    busy = make_client(make_tenant("busy", rate_limit_per_minute=1))
    calm = make_client(make_tenant("calm", rate_limit_per_minute=1))
    assert busy.get("/v1/tenant").status_code == 200
    assert busy.get("/v1/tenant").status_code == 429
    assert calm.get("/v1/tenant").status_code == 200


def test_all_keys_of_a_tenant_share_one_budget(make_tenant, make_client):
    tenant = make_tenant("shared", rate_limit_per_minute=2)
    first, second = make_client(tenant), make_client(tenant)
    assert first.get("/v1/tenant").status_code == 200
    assert second.get("/v1/tenant").status_code == 200
    assert first.get("/v1/tenant").status_code == 429


@pytest.fixture
def process(settings):
    """rate_limit_check as a fresh API process sees it, at the start of a window no other test uses
    (``window``, ``now``), with blocks of at most 32; ``blocks(d)`` switches to another process's."""
    from apps.tenants import ratelimit

    settings.STROP_RATE_LIMIT_BLOCK = 32
    window = 10**7 + int(time.time() * 1000) % 10**6
    ratelimit._blocks = {}

    class Process:
        def __init__(self) -> None:
            self.window, self.now = window, window * ratelimit.WINDOW_S + 1.0

        def check(self, tenant) -> bool:
            try:
                ratelimit.rate_limit_check(tenant, now=self.now)
                return True
            except RateLimited:
                return False

        def counted(self, tenant) -> int:
            value = ratelimit.redis_client(settings.REDIS_URL).get(f"strop:rl:{tenant.pk}:{self.window}")
            return int(value or 0)

        def blocks(self, blocks: dict) -> None:
            ratelimit._blocks = blocks

    yield Process()
    ratelimit._blocks = {}


def test_far_from_the_limit_a_process_asks_redis_once_per_block(make_tenant, process):
    tenant = make_tenant("roomy", rate_limit_per_minute=6000)
    assert all(process.check(tenant) for _ in range(40))
    assert process.counted(tenant) == 64  # two blocks of 32 (INCRBY 32 twice), not 40 increments of one


def test_near_the_limit_two_processes_never_serve_more_than_the_limit(make_tenant, process):
    """Two API processes, each with its own blocks, alternate one tenant's requests in one window:
    no more than the limit is served, and their unspent blocks cost at most a request each."""
    tenant = make_tenant("edge", rate_limit_per_minute=100)
    mine: dict = {}
    theirs: dict = {}
    served = 0
    for n in range(300):
        process.blocks(mine if n % 2 else theirs)
        served += process.check(tenant)
    assert 98 <= served <= 100
    assert process.counted(tenant) <= 102  # once the count reached the limit, neither asked again


def test_over_the_limit_the_process_refuses_without_asking_redis_again(make_tenant, process):
    tenant = make_tenant("runaway", rate_limit_per_minute=3)
    assert [process.check(tenant) for _ in range(10)] == [True] * 3 + [False] * 7
    assert process.counted(tenant) == 3


def test_a_raised_limit_applies_to_the_next_request(make_tenant, process):
    tenant = make_tenant("raised", rate_limit_per_minute=1)
    assert [process.check(tenant) for _ in range(2)] == [True, False]
    tenant.rate_limit_per_minute = 1000
    assert process.check(tenant)


def test_over_the_limit_over_http_is_429_with_retry_after_on_every_request(make_tenant, make_client):
    tenant = make_tenant("refused", rate_limit_per_minute=1)
    client = make_client(tenant)
    client.get("/v1/tenant")
    for _ in range(3):  # refused by this process without asking Redis: the same answer
        response = client.get("/v1/tenant")
        assert response.status_code == 429 and 1 <= int(response["Retry-After"]) <= 60


def test_a_process_serves_from_its_block_while_redis_is_down_and_says_so_once_it_needs_another(
    private_redis, make_tenant, process, settings, caplog
):
    from apps.tenants import ratelimit

    settings.REDIS_URL = private_redis.url()
    ratelimit.redis_outage.__init__()  # this process's view of Redis, fresh for this test
    tenant = make_tenant("outage", rate_limit_per_minute=6000)
    try:
        assert process.check(tenant)  # takes a block of 32
        private_redis.stop()
        assert all(process.check(tenant) for _ in range(31))  # spent from the block: Redis is not asked
        assert not [r for r in caplog.records if "rate limits are not enforced" in r.getMessage()]
        assert all(process.check(tenant) for _ in range(10))  # a new block: Redis is gone, served uncounted
        assert len([r for r in caplog.records if "rate limits are not enforced" in r.getMessage()]) == 1
    finally:
        ratelimit.redis_outage.__init__()


@pytest.fixture
def redis_down(private_redis, settings):
    """Redis as this process sees it, stopped after ``up()`` let the test take a first block."""
    from apps.tenants import ratelimit

    settings.REDIS_URL = private_redis.url()
    ratelimit.redis_outage.__init__()
    ratelimit._served = {}
    yield private_redis
    ratelimit.redis_outage.__init__()
    ratelimit._served = {}


def test_with_redis_down_a_process_refuses_past_the_tenants_limit(redis_down, make_tenant, process, settings):
    settings.STROP_RATE_LIMIT_PROCESSES = 1  # the default: every process may serve the whole limit
    tenant = make_tenant("outage-capped", rate_limit_per_minute=10)
    assert process.check(tenant)  # counted in Redis
    redis_down.stop()
    served = [process.check(tenant) for _ in range(15)]
    assert served == [True] * 9 + [False] * 6  # 10 in this window, what Redis counted included


def test_with_redis_down_a_process_serves_its_share_of_the_limit(redis_down, make_tenant, process, settings):
    from apps.tenants import ratelimit

    settings.STROP_RATE_LIMIT_PROCESSES = 4
    tenant = make_tenant("outage-share", rate_limit_per_minute=20)
    redis_down.stop()
    assert [process.check(tenant) for _ in range(7)] == [True] * 5 + [False] * 2
    with pytest.raises(RateLimited) as refused:
        ratelimit.rate_limit_check(tenant, now=process.now)
    assert "while Redis is unreachable: at most 5" in refused.value.message
    assert refused.value.details["local_limit_per_minute"] == 5


def test_with_redis_down_a_batch_costs_its_items_locally(redis_down, make_tenant, process, settings):
    from apps.tenants import ratelimit

    settings.STROP_RATE_LIMIT_PROCESSES = 1
    tenant = make_tenant("outage-batch", rate_limit_per_minute=10)
    redis_down.stop()
    ratelimit.rate_limit_check(tenant, cost=6, batch=(6, 6), now=process.now)  # 6 of 10
    with pytest.raises(RateLimited) as refused:
        ratelimit.rate_limit_check(tenant, cost=6, batch=(6, 6), now=process.now)  # 12: refused whole
    assert "batch of 6 items costs 6" in refused.value.message
    assert [process.check(tenant) for _ in range(5)] == [True] * 4 + [False]


def test_with_redis_down_over_http_requests_past_the_local_limit_are_429(
    redis_down, make_tenant, make_client, settings
):
    from apps.tenants import ratelimit

    if time.time() % ratelimit.WINDOW_S > ratelimit.WINDOW_S - 10:  # the five requests share one window
        time.sleep(ratelimit.WINDOW_S - time.time() % ratelimit.WINDOW_S + 0.1)
    settings.STROP_RATE_LIMIT_PROCESSES = 1
    tenant = make_tenant("outage-http", rate_limit_per_minute=3)
    client = make_client(tenant)
    redis_down.stop()
    codes = [client.get("/v1/tenant").status_code for _ in range(5)]
    assert codes == [200, 200, 200, 429, 429]
    response = client.get("/v1/tenant")
    assert int(response["Retry-After"]) >= 1 and response.json()["error"]["code"] == "rate_limited"
