"""Webhooks: signed deliveries, retried until the endpoint answers, kept as rows so none is lost,
refused for addresses on the operator's own networks, and sent by a real Celery worker when a
training run fails. The endpoint is a real HTTP server on this machine."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest
from django.db import transaction
from django.utils import timezone

from apps.common.exceptions import ValidationFailed
from apps.notifications.models import WebhookDelivery
from apps.notifications.services import (
    notification_send,
    webhook_address_problem,
    webhook_create,
    webhook_deliver,
    webhook_url_problem,
)
from apps.tenants.models import AuditEvent
from tests.fixtures.workers import wait_until


def _due(delivery: WebhookDelivery) -> str:
    """One attempt at ``delivery`` as if its backoff had passed (its retry's message is due)."""
    WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
    return webhook_deliver(delivery.pk).status


def _verified(headers: dict[str, str], body: bytes, secret: str) -> bool:
    signed = headers["X-Strop-Timestamp"].encode() + b"." + body
    expected = "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return hmac.compare_digest(headers["X-Strop-Signature"], expected)


@pytest.mark.django_db
def test_a_delivery_is_signed_and_retried_until_the_endpoint_answers(make_tenant, receiver, local_endpoints):
    endpoint = receiver([500, 503])
    tenant = make_tenant("hooks")
    webhook = webhook_create(tenant, url=endpoint.url, events=["run.failed", "version.promoted"], actor="test")
    assert AuditEvent.objects.filter(tenant=tenant, action="webhook.create").exists()
    with transaction.atomic():
        [delivery] = notification_send(tenant, event="run.failed", data={"run": 7, "adapter": "tab"})
    assert notification_send(tenant, event="experiment.decided", data={}) == []  # not subscribed

    first = webhook_deliver(delivery.pk)
    assert (first.status, first.retry_in) == ("pending", 10)
    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.response_status, delivery.next_attempt_at is not None) == (1, 500, True)
    assert webhook_deliver(delivery.pk).status == "skipped"  # not due yet: an early message sends nothing
    assert _due(delivery) == "pending"
    assert _due(delivery) == "delivered"
    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.response_status, delivery.error) == (3, 200, "")
    assert _due(delivery) == "skipped"  # a delivered event is never sent again

    assert len(endpoint.received) == 3
    headers, body = endpoint.received[-1]
    assert _verified(headers, body, webhook.secret)
    assert not _verified(headers, body, "whsec_another")
    sent = json.loads(body)
    assert sent["id"] == delivery.pk and sent["event"] == "run.failed" and sent["data"] == {"run": 7, "adapter": "tab"}
    assert headers["X-Strop-Event"] == "run.failed"


@pytest.mark.django_db
def test_a_delivery_that_never_succeeds_fails_after_its_last_attempt(make_tenant, receiver, local_endpoints, settings):
    settings.STROP_WEBHOOK_MAX_ATTEMPTS = 2
    endpoint = receiver([500, 500, 500])
    tenant = make_tenant("hooks-down")
    webhook_create(tenant, url=endpoint.url, events=["run.failed"], actor="test")
    [delivery] = notification_send(tenant, event="run.failed", data={})
    assert [_due(delivery) for _ in range(3)] == ["pending", "failed", "skipped"]
    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.error) == ("failed", 2, "answered 500")


@pytest.mark.parametrize(
    "url",
    [
        "https://127.0.0.1/hook",
        "https://10.1.2.3/hook",
        "https://169.254.169.254/latest/meta-data",
        "https://[::1]/hook",
        "https://localhost/hook",
        "http://93.184.216.34/hook",  # public, but not https
        "ftp://example.com/hook",
        "https://bücher.example/hook",  # an international host in its xn-- form only
        "https://hooks.example.com/a b",
        "https://user:pass@93.184.216.34/hook",
    ],
)
def test_an_address_on_the_operators_networks_or_without_https_is_refused(url, settings):
    settings.STROP_WEBHOOK_ALLOW_PRIVATE = False
    assert webhook_address_problem(url) is not None


@pytest.mark.django_db
def test_registering_a_refused_address_names_the_field_and_stores_nothing(make_tenant, settings):
    settings.STROP_WEBHOOK_ALLOW_PRIVATE = False
    tenant = make_tenant("hooks-ssrf")
    with pytest.raises(ValidationFailed, match="^url: the host resolves to an address that is not public$"):
        webhook_create(tenant, url="https://127.0.0.1:8000/admin", events=["run.failed"], actor="test")
    with pytest.raises(ValidationFailed, match="^events: "):
        webhook_create(tenant, url="https://93.184.216.34/hook", events=["nope"], actor="test")
    assert not tenant.webhooks.exists()


MALFORMED_URLS = [
    "https://[abc/hook",  # an IPv6 bracket never closed
    "https://a]b/",  # a bracket never opened
    "https://[not-an-address]/hook",
    "https://exa\uff0fmple.com/",  # a fullwidth solidus: NFKC turns it into "/" inside the host
]


@pytest.mark.parametrize("url", MALFORMED_URLS)
@pytest.mark.parametrize("allow_private", [False, True])
def test_a_url_python_cannot_split_is_a_problem_of_its_form_not_an_error(url, allow_private, settings):
    settings.STROP_WEBHOOK_ALLOW_PRIVATE = allow_private
    assert webhook_url_problem(url)
    assert webhook_address_problem(url)


@pytest.mark.django_db
@pytest.mark.parametrize("url", MALFORMED_URLS)
def test_registering_a_url_python_cannot_split_names_the_field_and_stores_nothing(make_tenant, url):
    tenant = make_tenant("hooks-malformed")
    with pytest.raises(ValidationFailed, match="^url: "):
        webhook_create(tenant, url=url, events=["run.failed"], actor="test")
    assert not tenant.webhooks.exists()
    assert not AuditEvent.objects.filter(tenant=tenant, action="webhook.create").exists()


def test_a_failed_training_run_reaches_the_endpoint_through_a_real_worker(
    local_endpoints, receiver, make_tenant, tiny_starter_model, celery_workers
):
    from apps.adapters.services import adapter_create, base_model_register
    from apps.training.models import TrainingRun
    from apps.training.services import training_run_advance

    endpoint = receiver([])
    tenant = make_tenant("hooks-run")
    adapter = adapter_create(
        tenant, name="tab", base_model=base_model_register(name="base", path=tiny_starter_model), is_default=True
    )
    webhook = webhook_create(tenant, url=endpoint.url, events=["run.failed"], actor="test")
    # A run some trainer was training (made as a row: no gpu worker is involved), which then fails.
    run = TrainingRun.objects.create(tenant=tenant, adapter=adapter, status=TrainingRun.Status.TRAINING)
    with transaction.atomic():
        assert training_run_advance(run, status=TrainingRun.Status.FAILED, error="RuntimeError: out of memory")
    wait_until(lambda: endpoint.received, timeout=60, what="the webhook delivery", workers=celery_workers)
    headers, body = endpoint.received[0]
    assert _verified(headers, body, webhook.secret)
    assert json.loads(body)["data"] == {
        "run": run.pk,
        "adapter": "tab",
        "status": "failed",
        "error": "RuntimeError: out of memory",
    }
    wait_until(
        lambda: WebhookDelivery.objects.filter(status="delivered").exists(), timeout=30, what="the delivered row"
    )


@pytest.mark.django_db
def test_a_second_webhook_for_the_same_url_is_refused_naming_the_field(make_tenant, local_endpoints):
    tenant, other = make_tenant("hooks-same-url"), make_tenant("hooks-same-url-other")
    url = "http://127.0.0.1:9/hook"
    first = webhook_create(tenant, url=url, events=["run.failed"], actor="test")
    with pytest.raises(ValidationFailed, match="^url: this tenant already has a webhook for this URL"):
        webhook_create(tenant, url=f" {url} ", events=["version.promoted"], actor="test")
    assert list(tenant.webhooks.all()) == [first]
    assert AuditEvent.objects.filter(tenant=tenant, action="webhook.create").count() == 1
    webhook_create(other, url=url, events=["run.failed"], actor="test")  # another tenant's endpoint may share it
