"""A webhook's signing secret rotates: the new one is shown once and audited, deliveries carry both
signatures during the overlap (a receiver on either secret accepts them), and only the new one after."""

from __future__ import annotations

import hashlib
import hmac
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.notifications.models import Webhook, WebhookDelivery
from apps.notifications.services import (
    notification_send,
    webhook_create,
    webhook_deliver,
    webhook_secret_rotate,
)
from apps.tenants.models import AuditEvent


def from_strop(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """A receiver's check, as docs/dashboard.md gives it: any of the signatures matches."""
    signed = headers["X-Strop-Timestamp"].encode() + b"." + body
    expected = "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return any(hmac.compare_digest(value.strip(), expected) for value in headers["X-Strop-Signature"].split(","))


def _send(tenant, endpoint) -> tuple[dict[str, str], bytes]:
    [delivery] = notification_send(tenant, event="run.failed", data={"run": 1})
    assert webhook_deliver(delivery.pk).status == "delivered"
    return endpoint.received[-1]


@pytest.mark.django_db
def test_after_a_rotation_both_secrets_verify_until_the_overlap_ends(make_tenant, receiver, local_endpoints, settings):
    settings.STROP_WEBHOOK_SECRET_OVERLAP_S = 24 * 3600
    endpoint = receiver([])
    tenant = make_tenant("hooks-rotate")
    webhook = webhook_create(tenant, url=endpoint.url, events=["run.failed"], actor="test")
    old_secret = webhook.secret

    rotated = webhook_secret_rotate(tenant, webhook=webhook, actor="user:1")

    assert rotated.secret != old_secret and rotated.secret.startswith("whsec_")
    audit = AuditEvent.objects.get(tenant=tenant, action="webhook.secret_rotate")
    assert (audit.actor, audit.target_id) == ("user:1", str(webhook.pk))
    assert old_secret not in str(audit.data) and rotated.secret not in str(audit.data)

    headers, body = _send(tenant, endpoint)
    assert len(headers["X-Strop-Signature"].split(",")) == 2
    assert from_strop(rotated.secret, headers, body)
    assert from_strop(old_secret, headers, body)  # a receiver not yet switched still accepts it
    assert not from_strop("whsec_another", headers, body)

    # The overlap ends (a day later): only the new secret signs.
    Webhook.objects.filter(pk=webhook.pk).update(previous_secret_expires_at=timezone.now() - timedelta(seconds=1))
    headers, body = _send(tenant, endpoint)
    assert len(headers["X-Strop-Signature"].split(",")) == 1
    assert from_strop(rotated.secret, headers, body)
    assert not from_strop(old_secret, headers, body)


@pytest.mark.django_db
def test_a_second_rotation_in_the_overlap_drops_the_oldest_secret_at_once(make_tenant, receiver, local_endpoints):
    endpoint = receiver([])
    tenant = make_tenant("hooks-rotate-twice")
    first = webhook_create(tenant, url=endpoint.url, events=["run.failed"], actor="test").secret
    webhook = Webhook.objects.get(tenant=tenant)
    second = webhook_secret_rotate(tenant, webhook=webhook, actor="test").secret
    third = webhook_secret_rotate(tenant, webhook=webhook, actor="test").secret

    headers, body = _send(tenant, endpoint)
    assert from_strop(third, headers, body) and from_strop(second, headers, body)
    assert not from_strop(first, headers, body)
    assert WebhookDelivery.objects.filter(tenant=tenant, status="delivered").count() == 1
