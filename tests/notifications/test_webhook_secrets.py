"""A webhook's signing secret rotates: the new one is shown once and audited, deliveries carry both
signatures during the overlap (a receiver on either secret accepts them), and only the new one after.
The database holds every secret sealed under STORED_SECRETS_KEY, which rotates too."""

from __future__ import annotations

import hashlib
import hmac
import pickle
import secrets
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from apps.common.stored_secrets import Unreadable, current_key_id, opened, sealed, sealed_by
from apps.notifications.models import Webhook, WebhookDelivery
from apps.notifications.services import (
    notification_send,
    webhook_create,
    webhook_deliver,
    webhook_secret_rotate,
)
from apps.notifications.services.webhooks import ROTATION_REPEAT_WINDOW_S
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
    _rotated_ago(webhook, seconds=ROTATION_REPEAT_WINDOW_S + 1)  # the receiver had time to take `second`
    third = webhook_secret_rotate(tenant, webhook=webhook, actor="test").secret

    headers, body = _send(tenant, endpoint)
    assert from_strop(third, headers, body) and from_strop(second, headers, body)
    assert not from_strop(first, headers, body)
    assert WebhookDelivery.objects.filter(tenant=tenant, status="delivered").count() == 1


def _rotated_ago(webhook: Webhook, *, seconds: float) -> None:
    Webhook.objects.filter(pk=webhook.pk).update(secret_rotated_at=timezone.now() - timedelta(seconds=seconds))


@pytest.mark.django_db
def test_a_rotation_repeated_at_once_replaces_the_unshown_secret_and_keeps_the_receivers(
    make_tenant, receiver, local_endpoints
):
    endpoint = receiver([])
    tenant = make_tenant("hooks-rotate-repeated")
    receivers = webhook_create(tenant, url=endpoint.url, events=["run.failed"], actor="test").secret
    webhook = Webhook.objects.get(tenant=tenant)
    first = webhook_secret_rotate(tenant, webhook=webhook, actor="test")
    _rotated_ago(webhook, seconds=1)  # the form sent again (a double click): well within ROTATION_REPEAT_WINDOW_S
    repeated = webhook_secret_rotate(tenant, webhook=webhook, actor="test")

    assert repeated.previous_secret == receivers
    assert repeated.previous_secret_expires_at == first.previous_secret_expires_at  # its overlap is not extended
    headers, body = _send(tenant, endpoint)
    assert from_strop(repeated.secret, headers, body) and from_strop(receivers, headers, body)
    assert not from_strop(first.secret, headers, body)
    audits = AuditEvent.objects.filter(tenant=tenant, action="webhook.secret_rotate").order_by("id")
    assert [a.data["repeat"] for a in audits] == [False, True]
    assert audits[1].data["previous_secret_valid_until"] == first.previous_secret_expires_at.isoformat()


def _stored(webhook_id: int) -> tuple[str, str]:
    """The secret columns as the database holds them (what a dump or a replica would show)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT secret, previous_secret FROM notifications_webhook WHERE id = %s", [webhook_id])
        return cursor.fetchone()


@pytest.mark.django_db
def test_the_database_holds_each_signing_secret_sealed_never_in_the_clear(make_tenant, receiver, local_endpoints):
    endpoint = receiver([])
    tenant = make_tenant("hooks-sealed")
    webhook = webhook_create(tenant, url=endpoint.url, events=["run.failed"], actor="test")
    first = webhook.secret
    rotated = webhook_secret_rotate(tenant, webhook=webhook, actor="test")

    secret, previous = _stored(webhook.pk)
    key_id = current_key_id()
    for stored, plain in ((secret, rotated.secret), (previous, first)):
        assert sealed_by(stored, key_id), stored
        assert plain not in stored and plain.removeprefix("whsec_") not in stored
    assert opened(secret, purpose="webhook.secret") == rotated.secret
    assert sealed(first, purpose="webhook.secret") != sealed(first, purpose="webhook.secret")  # a nonce each
    assert isinstance(opened(secret, purpose="another.secret"), Unreadable)  # bound to what it is

    loaded = Webhook.objects.get(pk=webhook.pk)
    assert (loaded.secret, loaded.previous_secret) == (rotated.secret, first)
    headers, body = _send(tenant, endpoint)
    assert from_strop(rotated.secret, headers, body) and from_strop(first, headers, body)


@pytest.mark.django_db
def test_a_new_key_opens_what_the_old_one_sealed_through_its_fallback_and_reseal_moves_them(
    make_tenant, receiver, local_endpoints, settings
):
    endpoint = receiver([])
    tenant = make_tenant("hooks-key-rotation")
    webhook = webhook_create(tenant, url=endpoint.url, events=["run.failed"], actor="test")
    old_key = settings.STORED_SECRETS_KEY
    settings.STORED_SECRETS_KEY, settings.STORED_SECRETS_KEY_FALLBACKS = secrets.token_urlsafe(50), [old_key]

    headers, body = _send(tenant, endpoint)  # sealed under the old key, opened through the fallback
    assert from_strop(webhook.secret, headers, body)
    assert not sealed_by(_stored(webhook.pk)[0], current_key_id())

    out = StringIO()
    call_command("stored_secrets_reseal", stdout=out)
    assert "1 resealed" in out.getvalue() and "0 already" in out.getvalue()
    assert sealed_by(_stored(webhook.pk)[0], current_key_id())
    settings.STORED_SECRETS_KEY_FALLBACKS = []  # the old key can go now
    headers, body = _send(tenant, endpoint)
    assert from_strop(webhook.secret, headers, body)


@pytest.mark.django_db
def test_a_secret_no_key_opens_fails_its_delivery_saying_why_and_a_rotation_recovers(
    make_tenant, receiver, local_endpoints, settings, caplog
):
    endpoint = receiver([])
    tenant = make_tenant("hooks-key-lost")
    webhook = webhook_create(tenant, url=endpoint.url, events=["run.failed"], actor="test")
    settings.STORED_SECRETS_KEY, settings.STORED_SECRETS_KEY_FALLBACKS = secrets.token_urlsafe(50), []

    [delivery] = notification_send(tenant, event="run.failed", data={"run": 1})
    assert webhook_deliver(delivery.pk).status == "pending"  # retried: the operator may bring the key back
    delivery.refresh_from_db()
    assert delivery.error == "not sent: its signing secret cannot be read (ask the operator, or rotate the secret)"
    assert endpoint.received == []
    assert "STORED_SECRETS_KEY_FALLBACKS" in caplog.text and "whsec_" not in caplog.text  # the operator's detail
    with pytest.raises(CommandError, match=f"webhooks {webhook.pk}"):
        call_command("stored_secrets_reseal", stdout=StringIO())

    loaded = Webhook.objects.get(pk=webhook.pk)  # the row still loads (its pages list it)
    rotated = webhook_secret_rotate(tenant, webhook=loaded, actor="test")
    assert rotated.previous_secret == "" and rotated.previous_secret_expires_at is None
    audit = AuditEvent.objects.get(tenant=tenant, action="webhook.secret_rotate")
    assert audit.data["previous_secret_valid_until"] is None  # nothing signs beside the new one
    headers, body = _send(tenant, endpoint)
    assert from_strop(rotated.secret, headers, body)
    assert len(headers["X-Strop-Signature"].split(",")) == 1


@pytest.mark.django_db
def test_a_malformed_or_expired_unreadable_secret_never_breaks_loading_and_reseal_drops_the_expired_one(
    make_tenant, settings
):
    tenant = make_tenant("hooks-odd")
    settings.STROP_WEBHOOK_ALLOW_PRIVATE = True
    webhook = webhook_create(tenant, url="http://127.0.0.1:9/hook", events=["run.failed"], actor="test")
    rotated = webhook_secret_rotate(tenant, webhook=webhook, actor="test")
    lost = sealed("whsec_lost", purpose="webhook.secret").replace(current_key_id(), "00000000", 1)
    Webhook.objects.filter(pk=webhook.pk).update(previous_secret_expires_at=timezone.now() - timedelta(seconds=1))
    _store(webhook.pk, previous_secret=lost)
    _store(webhook.pk, secret="v1:abc")  # not even a sealed value's shape

    loaded = Webhook.objects.get(pk=webhook.pk)
    assert isinstance(loaded.secret, Unreadable) and isinstance(loaded.previous_secret, Unreadable)
    assert pickle.loads(pickle.dumps(loaded)).previous_secret.stored == lost  # a cache keeps what is stored
    loaded.save()  # saving a row with such values writes back what was stored, unchanged
    assert _stored(webhook.pk) == ("v1:abc", lost)

    with pytest.raises(CommandError, match=f"webhooks {webhook.pk}"):  # its current secret: left, named
        call_command("stored_secrets_reseal", stdout=StringIO())
    assert _stored(webhook.pk) == ("v1:abc", "")  # the expired previous one signs nothing: dropped
    _store(webhook.pk, secret=sealed(rotated.secret, purpose="webhook.secret"))
    assert Webhook.objects.get(pk=webhook.pk).secret == rotated.secret


@pytest.mark.django_db
def test_dumpdata_writes_the_sealed_secrets_and_loaddata_restores_them(make_tenant, settings, tmp_path):
    tenant = make_tenant("hooks-dump")
    settings.STROP_WEBHOOK_ALLOW_PRIVATE = True
    webhook = webhook_create(tenant, url="http://127.0.0.1:9/hook", events=["run.failed"], actor="test")
    dump = tmp_path / "webhooks.json"
    call_command("dumpdata", "notifications.Webhook", output=str(dump))
    assert webhook.secret not in dump.read_text() and '"secret": "v1:' in dump.read_text()

    Webhook.objects.filter(pk=webhook.pk).delete()
    call_command("loaddata", str(dump), stdout=StringIO())
    assert Webhook.objects.get(pk=webhook.pk).secret == webhook.secret


def _store(webhook_id: int, **columns: str) -> None:
    """Write the columns' stored text as it is (what an older release, or a damaged row, holds)."""
    from django.db import connection

    with connection.cursor() as cursor:
        for column, value in columns.items():
            cursor.execute(f"UPDATE notifications_webhook SET {column} = %s WHERE id = %s", [value, webhook_id])
