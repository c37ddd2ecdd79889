"""When calls are tried again, and how long the client waits."""

from __future__ import annotations

import time

import pytest
from strop import APIConnectionError, APITimeoutError, BatcherOptions, RateLimitError, Strop

from apps.interactions.models import Feedback, Interaction
from tests.sdk.conftest import closed_port, wait_until

pytestmark = pytest.mark.django_db(transaction=True)


def test_connection_refused_is_retried_for_every_call_then_raised(traffic):
    url = f"http://127.0.0.1:{closed_port()}"
    with Strop(base_url=url, api_key="strop_x_y", max_retries=2, http_client=traffic.client()) as client:
        with pytest.raises(APIConnectionError):
            client.interactions.list()
        with pytest.raises(APIConnectionError):
            client.completions.create(prompt="x")  # never reached the server: safe to send again
    assert traffic.requests("/v1/interactions") == 3 and traffic.requests("/v1/completions") == 3


def test_a_sent_completion_is_never_retried_but_a_read_is(silent_url, traffic):
    http = traffic.client(timeout=1.0)
    with Strop(base_url=silent_url, api_key="strop_x_y", max_retries=2, http_client=http) as client:
        with pytest.raises(APITimeoutError):
            client.completions.create(prompt="x")
        with pytest.raises(APITimeoutError):
            client.interactions.get("some-id")
    assert traffic.requests("/v1/completions") == 1
    assert traffic.requests("/v1/interactions/some-id") == 3


def test_a_sent_rollback_or_erase_is_never_retried(silent_url, traffic):
    """A second rollback to the same version answers 409 ``not_earlier`` and a second erase 404: after
    a lost answer, a retry would turn the change that happened into an error."""
    http = traffic.client(timeout=1.0)
    with Strop(base_url=silent_url, api_key="strop_x_y", max_retries=2, http_client=http) as client:
        with pytest.raises(APITimeoutError):
            client.adapters.rollback("tab", version=1)
        with pytest.raises(APITimeoutError):
            client.users.erase("dev-1")
    assert traffic.requests("/v1/adapters/tab/rollback") == 1
    assert traffic.requests("/v1/users/dev-1") == 1


def _exhaust_budget(api) -> None:
    """Spend the tenant's budget for the current minute, with at least 15 s of it left, so the
    calls that follow are refused until the window turns."""
    wait_until(lambda: time.time() % 60 < 45, timeout=61, interval=0.2)
    with Strop(base_url=api.url, api_key=api.key, max_retries=0) as probe:
        for _ in range(20):
            try:
                probe.interactions.list(limit=1)
            except RateLimitError:
                return
    raise AssertionError("the rate limit never answered 429")


@pytest.mark.slow
def test_rate_limited_calls_and_batches_wait_for_retry_after_then_succeed(make_api, traffic):
    api = make_api(rate_limit_per_minute=4)
    options = BatcherOptions(flush_interval=0.0)
    http = traffic.client(timeout=60)
    with Strop(base_url=api.url, api_key=api.key, http_client=http, feedback_batching=options) as client:
        _exhaust_budget(api)
        client.feedback.enqueue(client_id="later", outcome="accepted")  # the batcher meets the 429 too
        logged = client.interactions.log(client_id="c-1", prompt="x = ", completion="1")
        assert logged.created is True
        assert client.feedback.flush(timeout=120) is True

    for path in ("/v1/interactions", "/v1/feedback"):
        assert traffic.statuses(path) == [429, 201 if path == "/v1/interactions" else 207]
        events = [e for e in traffic.events if e[2] == path]
        (refused_at, _, _, _, retry_after), (retried_at, *_) = events[1], events[2]
        assert retry_after is not None and 1 <= int(retry_after) <= 60
        assert retried_at - refused_at >= int(retry_after)
    assert Interaction.objects.filter(tenant=api.tenant).count() == 1
    assert Feedback.objects.filter(tenant=api.tenant, pending_client_id="later").count() == 1


def test_a_retry_after_longer_than_the_cap_fails_the_batch_at_once_and_records_it(make_api, traffic):
    api = make_api(rate_limit_per_minute=1)
    _exhaust_budget(api)
    options = BatcherOptions(flush_interval=0.0, max_retry_after=0.5)
    with Strop(
        base_url=api.url, api_key=api.key, http_client=traffic.client(timeout=60), feedback_batching=options
    ) as client:
        client.feedback.enqueue(client_id="c-1", outcome="accepted")
        assert client.feedback.flush(timeout=60) is False
        (failed,) = client.feedback.batcher.failures
    assert traffic.requests("/v1/feedback") == 1
    assert isinstance(failed.error, RateLimitError) and failed.error.retry_after >= 1
    assert [(item["client_id"], item["outcome"]) for item in failed.items] == [("c-1", "accepted")]


def test_a_batch_costing_more_than_the_whole_limit_is_refused_once_and_not_retried(make_api, traffic):
    """Waiting cannot help a call that costs more than the tenant's whole per-minute limit: the 429
    carries no Retry-After and says ``x-should-retry: false`` (as OpenAI's clients read it), so the
    SDK raises at once instead of retrying it for minutes."""
    api = make_api(rate_limit_per_minute=3)
    items = [{"client_id": f"big-{i}", "prompt": "x = ", "completion": "1"} for i in range(1000)]
    with Strop(base_url=api.url, api_key=api.key, http_client=traffic.client(timeout=60)) as client:
        started = time.monotonic()
        with pytest.raises(RateLimitError) as refused:
            client.interactions.log_batch(items)
        assert time.monotonic() - started < 30
    assert traffic.requests("/v1/interactions") == 1
    assert refused.value.retry_after is None and "more than the whole limit" in str(refused.value)
    response = refused.value.response
    assert response.headers["x-should-retry"] == "false" and "retry-after" not in response.headers
    assert not Interaction.objects.filter(tenant=api.tenant).exists()
