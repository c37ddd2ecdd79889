"""A completion costs rate-limit units by its work: n (or best_of) x max_tokens as served, one unit
per STROP_RATE_LIMIT_TOKENS_PER_UNIT tokens (here 16), charged before anything is written.

vLLM is unreachable here (a closed port): a request the limit lets through is answered 503, after it
was charged; a refused one is a 429 and never reaches vLLM nor writes the end user."""

from __future__ import annotations

import socket
import time

import pytest

from apps.adapters.models import Adapter, BaseModel
from apps.cohorts.models import EndUser
from apps.interactions.models import ServingFailure
from apps.tenants import ratelimit

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _sixteen_tokens_per_unit(settings) -> None:
    settings.STROP_RATE_LIMIT_TOKENS_PER_UNIT = 16
    with socket.socket() as sock:  # a port nobody listens on: vLLM is down, at once
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings.VLLM_BASE_URLS = [f"http://127.0.0.1:{port}"]


@pytest.fixture(autouse=True)
def _fresh_window() -> None:
    """Counts are per minute: a test that would straddle two windows waits for the next one."""
    if time.time() % ratelimit.WINDOW_S > ratelimit.WINDOW_S - 15:
        time.sleep(ratelimit.WINDOW_S - time.time() % ratelimit.WINDOW_S + 0.1)


def _serving_client(make_tenant, make_client, slug: str, limit: int):
    tenant = make_tenant(slug, rate_limit_per_minute=limit)
    base = BaseModel.objects.create(name=f"{slug}-base", path="/nonexistent", family="qwen")
    Adapter.objects.create(tenant=tenant, name="tab", base_model=base, is_default=True)  # max 256 tokens
    return make_client(tenant, scopes=["serve"])


def _complete(client, **fields):
    return client.post("/v1/completions", {"prompt": "def f(", **fields}, format="json")


def test_one_completion_of_large_n_times_max_tokens_spends_what_many_small_ones_would(make_tenant, make_client):
    small = _serving_client(make_tenant, make_client, "small-calls", limit=8)
    large = _serving_client(make_tenant, make_client, "large-call", limit=8)

    codes = [_complete(small, max_tokens=16).status_code for _ in range(9)]
    assert codes == [503] * 8 + [429]  # one unit each: eight pass (to a vLLM that is down)

    assert _complete(large, n=2, max_tokens=64).status_code == 503  # 2 x 64 tokens = 8 units
    refused = _complete(large, max_tokens=16)
    assert refused.status_code == 429, refused.content
    assert 1 <= int(refused["Retry-After"]) <= 60
    error = refused.json()["error"]
    assert error["code"] == "rate_limited" and "limit of 8 requests per minute" in error["message"]


def test_a_refused_completion_names_its_cost_and_writes_nothing(make_tenant, make_client):
    client = _serving_client(make_tenant, make_client, "refused", limit=8)
    assert _complete(client, max_tokens=16).status_code == 503  # 1 of 8
    refused = _complete(client, n=4, max_tokens=32, user="dev-1", opted_in=True)  # 8 more: 9 of 8
    assert refused.status_code == 429, refused.content
    error = refused.json()["error"]
    assert "completion of n=4 x max_tokens=32 costs 8 (one per 16 tokens)" in error["message"]
    assert error["details"] == {"limit_per_minute": 8, "cost": 8}
    assert not EndUser.objects.filter(external_id="dev-1").exists()  # charged before consent is written
    assert ServingFailure.objects.count() == 1  # only the first reached (the missing) vLLM


def test_best_of_counts_every_sequence_vllm_samples(make_tenant, make_client):
    client = _serving_client(make_tenant, make_client, "best-of", limit=8)
    refused = _complete(client, n=1, best_of=8, max_tokens=32)  # 8 x 32 = 16 units
    assert refused.status_code == 429
    assert "more than the whole limit" in refused.json()["error"]["message"]
    # Waiting cannot help: no Retry-After, and the header OpenAI's clients read before retrying a 429.
    assert refused["x-should-retry"] == "false" and not refused.has_header("Retry-After")


def test_max_tokens_is_charged_as_served_at_most_the_adapters_limit(make_tenant, make_client):
    client = _serving_client(make_tenant, make_client, "capped", limit=16)
    # Continue asks for 4096; the adapter serves 256 = 16 units, the whole limit, not 256 units.
    assert _complete(client, max_tokens=4096).status_code == 503
    assert _complete(client, max_tokens=1).status_code == 429


def test_a_chat_completion_without_max_tokens_costs_the_adapters_limit(make_tenant, make_client):
    client = _serving_client(make_tenant, make_client, "chat", limit=20)
    messages = [{"role": "user", "content": "hi"}]
    refused = client.post("/v1/chat/completions", {"messages": messages, "n": 2}, format="json")  # 2 x 256 = 32
    assert refused.status_code == 429
    message = refused.json()["error"]["message"]
    assert "completion of n=2 x max_tokens=256 costs 32" in message and "more than the whole limit" in message
    assert client.post("/v1/chat/completions", {"messages": messages}, format="json").status_code == 503  # 16 units


def test_a_stream_past_the_tenants_cap_is_refused_before_it_writes_or_spends(make_tenant, make_client, settings):
    """The tenant's one stream is open (a lease in Redis, as another API process holds it): a
    second stream is 429 too_many_streams before its end user is written or its work is charged
    (the one unit the API key's check takes, as for any request, is spent)."""
    import redis as redis_lib

    from apps.serving.admission import _key

    settings.STROP_SERVING_MAX_STREAMS_PER_TENANT = 1
    client = _serving_client(make_tenant, make_client, "one-stream", limit=2)
    tenant = EndUser._meta.get_field("tenant").related_model.objects.get(slug="one-stream")
    leases = redis_lib.Redis.from_url(settings.REDIS_URL)
    leases.zadd(_key(tenant.pk), {"held-elsewhere": time.time() + 60})
    try:
        refused = _complete(client, max_tokens=32, stream=True, user="new-dev")  # two units
        assert refused.status_code == 429 and refused.json()["error"]["code"] == "too_many_streams", refused.content
        assert not EndUser.objects.filter(tenant=tenant, external_id="new-dev").exists()
        down = _complete(client, max_tokens=16)
        assert down.status_code == 503  # the second unit is still there (vLLM is down)
        for answer in (refused, down, _complete(client, max_tokens=16)):  # refusals and errors say it too
            assert float(answer["X-Strop-Overhead-Ms"]) >= 0, answer.status_code
    finally:
        leases.delete(_key(tenant.pk))
