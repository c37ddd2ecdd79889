"""How a client is configured: the environment, ``default_headers`` and ``with_options``."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from strop import APIConnectionError, APIError, APITimeoutError, AsyncStrop, BatcherOptions, Strop, StropError

from apps.interactions.models import Feedback
from tests.sdk.conftest import closed_port

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def sent() -> list[httpx.Request]:
    return []


def test_the_key_and_the_address_come_from_the_environment(api, monkeypatch):
    monkeypatch.setenv("STROP_API_KEY", api.key)
    monkeypatch.setenv("STROP_BASE_URL", api.url + "/")
    with Strop() as client:
        assert client.base_url == api.url
        assert client.interactions.list().count == 0

    async def main() -> int:
        async with AsyncStrop() as client:
            return (await client.interactions.list()).count

    assert asyncio.run(main()) == 0


def test_arguments_win_over_the_environment(api, monkeypatch):
    monkeypatch.setenv("STROP_API_KEY", "strop_wrong_wrong")
    monkeypatch.setenv("STROP_BASE_URL", f"http://127.0.0.1:{closed_port()}")
    with Strop(base_url=api.url, api_key=api.key, max_retries=0) as client:
        assert client.interactions.list().count == 0


def test_no_key_anywhere_is_a_configuration_error_not_an_api_error(monkeypatch):
    monkeypatch.delenv("STROP_API_KEY", raising=False)
    for make in (Strop, AsyncStrop):
        with pytest.raises(StropError) as caught:
            make(base_url="http://127.0.0.1:1")
        assert not isinstance(caught.value, APIError) and "STROP_API_KEY" in str(caught.value)


def test_default_headers_go_with_every_request_and_with_options_adds_to_them(api, sent):
    http = httpx.Client(event_hooks={"request": [sent.append]})
    with Strop(
        base_url=api.url, api_key=api.key, default_headers={"X-Team": "search", "User-Agent": "ide/1"}, http_client=http
    ) as client:
        client.models.list()
        client.with_options(default_headers={"x-team": "infra", "X-Trace": "t-1"}).models.list()
        client.models.list()
    http.close()
    first, derived, last = (request.headers for request in sent)
    assert (first["x-team"], first["user-agent"], first["authorization"]) == ("search", "ide/1", f"Bearer {api.key}")
    assert (derived["x-team"], derived["x-trace"], derived["user-agent"]) == ("infra", "t-1", "ide/1")
    assert derived.get_list("x-team") == ["infra"]  # replaced, whatever the case of its name
    assert last["x-team"] == "search" and "x-trace" not in last  # the first client is unchanged


def test_with_options_shares_the_connection_pool_and_closing_it_leaves_the_pool_open(api):
    client = Strop(base_url=api.url, api_key=api.key)
    derived = client.with_options(timeout=30, max_retries=0)
    assert (derived.max_retries, derived.timeout.read, derived.base_url) == (0, 30, client.base_url)
    derived.close()
    assert derived.models.list() == client.models.list()  # the pool is still open, for both
    client.close()
    with pytest.raises(RuntimeError, match="closed"):  # the pool it used was the first client's
        derived.models.list()


def test_with_options_changes_the_retries_and_the_timeout_of_its_calls_only(silent_url, traffic, sent):
    url = f"http://127.0.0.1:{closed_port()}"
    with Strop(base_url=url, api_key="strop_x_y", max_retries=2, http_client=traffic.client()) as client:
        with pytest.raises(APIConnectionError):
            client.with_options(max_retries=0).interactions.list()
        assert traffic.requests() == 1
        with pytest.raises(APIConnectionError):
            client.interactions.list()
        assert traffic.requests() == 4

    http = httpx.Client(timeout=600, event_hooks={"request": [sent.append]})
    with Strop(base_url=silent_url, api_key="strop_x_y", max_retries=0, http_client=http) as client:
        started = time.monotonic()
        with pytest.raises(APITimeoutError):
            client.with_options(timeout=0.2).interactions.get("some-id")  # the server never answers
    http.close()
    assert sent[0].extensions["timeout"]["read"] == 0.2
    assert time.monotonic() - started < 60  # not the HTTP client's own 600 s


def test_a_derived_client_enqueues_into_the_batcher_of_its_parent(api):
    options = BatcherOptions(batch_size=1000, flush_interval=3600)
    with Strop(base_url=api.url, api_key=api.key, feedback_batching=options) as client:
        client.interactions.log_batch([{"client_id": f"c-{n}", "prompt": "x = ", "completion": "1"} for n in (1, 2)])
        derived = client.with_options(max_retries=5)
        derived.feedback.enqueue(client_id="c-1", outcome="accepted")
        assert derived.feedback.batcher is client.feedback.batcher
        derived.close()  # not the batcher's owner: nothing is flushed or closed
        assert client.feedback.batcher.stats.queued == 1
        client.feedback.enqueue(client_id="c-2", outcome="rejected")
        assert derived.feedback.flush(timeout=60) is True
        assert client.feedback.batcher.stats.delivered == 2
    rows = Feedback.objects.filter(tenant=api.tenant)
    assert sorted(rows.values_list("outcome", flat=True)) == ["accepted", "rejected"]


def test_the_async_client_has_default_headers_and_with_options_too(api, sent):
    async def record(request: httpx.Request) -> None:
        sent.append(request)

    async def main() -> tuple[int, int]:
        http = httpx.AsyncClient(event_hooks={"request": [record]})
        async with AsyncStrop(
            base_url=api.url, api_key=api.key, default_headers={"X-Team": "search"}, http_client=http
        ) as client:
            derived = client.with_options(max_retries=0, default_headers={"X-Trace": "t-1"})
            assert derived.max_retries == 0 and client.max_retries == 2
            await derived.models.list()
            await derived.close()
            first = (await client.interactions.list()).count
            second = (await derived.interactions.list()).count
        await http.aclose()
        return first, second

    assert asyncio.run(main()) == (0, 0)
    derived_request = sent[0].headers
    assert (derived_request["x-team"], derived_request["x-trace"]) == ("search", "t-1")
    assert sent[0].headers["user-agent"].endswith(" async")
