"""Webhooks: a tenant's endpoints hear about experiments decided, versions promoted or rolled back,
and training runs failed or rejected.

Every delivery is a row before it is sent (``notification_send``, in the transaction of the change
it reports), so none is lost when the worker or the broker is down: the worker sends it
(``webhook_deliver``), retries with backoff until ``STROP_WEBHOOK_MAX_ATTEMPTS``, and beat resends
any pending one whose message was lost. A delivery is a POST of JSON signed with the webhook's
secret: ``X-Strop-Signature: sha256=<hex HMAC-SHA256 of "<timestamp>.<body>">`` with the timestamp in
``X-Strop-Timestamp``, so a receiver can check both who sent it and that it is fresh.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import secrets
import socket
import time
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from apps.common.exceptions import ValidationFailed
from apps.common.tasks import enqueue, enqueue_on_commit
from apps.notifications.models import EVENTS, Webhook, WebhookDelivery
from apps.tenants.models import Tenant
from apps.tenants.services import audit_record

MAX_WEBHOOKS_PER_TENANT = 20
BACKOFF_S = (10, 60, 300, 1800, 7200)  # before the 2nd, 3rd, ... attempt


def webhook_address_problem(url: str) -> str | None:
    """Why Strop will not call ``url``, or None. Private, loopback, link-local and reserved
    addresses are refused (unless STROP_WEBHOOK_ALLOW_PRIVATE): a tenant's webhook must never
    reach the operator's own network. Checked when registering and again before every attempt."""
    parts = urlsplit(url)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        return "must be an http(s) URL with a host"
    if parts.username or parts.password:
        return "must not carry credentials; use the signature to authenticate Strop"
    if settings.STROP_WEBHOOK_ALLOW_PRIVATE:
        return None
    if parts.scheme != "https":
        return "must use https"
    try:
        infos = socket.getaddrinfo(parts.hostname, parts.port or 443, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return f"the host {parts.hostname!r} does not resolve"
    for info in infos:
        address = ipaddress.ip_address(info[4][0])
        if not address.is_global:
            return f"the host {parts.hostname!r} is on a private, loopback or reserved network ({address})"
    return None


@transaction.atomic
def webhook_create(tenant: Tenant, *, url: str, events: list[str], actor: str) -> Webhook:
    """Register an endpoint for ``events``; its signing secret is generated here (shown once)."""
    url = url.strip()
    problem = webhook_address_problem(url)
    if problem:
        raise ValidationFailed(f"url: {problem}")
    unknown = sorted(set(events) - set(EVENTS))
    if unknown or not events:
        raise ValidationFailed(f"events: choose one or more of {', '.join(EVENTS)}")
    if Webhook.objects.filter(tenant=tenant).count() >= MAX_WEBHOOKS_PER_TENANT:
        raise ValidationFailed(f"url: a tenant has at most {MAX_WEBHOOKS_PER_TENANT} webhooks; delete one first")
    webhook = Webhook.objects.create(
        tenant=tenant,
        url=url,
        events=[e for e in EVENTS if e in events],
        secret="whsec_" + secrets.token_urlsafe(32),
        created_by=actor,
    )
    audit_record(
        tenant,
        actor=actor,
        action="webhook.create",
        target_type="webhook",
        target_id=str(webhook.pk),
        data={"url": url, "events": webhook.events},
    )
    return webhook


@transaction.atomic
def webhook_delete(tenant: Tenant, *, webhook: Webhook, actor: str) -> None:
    if webhook.tenant_id != tenant.pk:
        raise ValueError("webhook belongs to another tenant")
    audit_record(
        tenant,
        actor=actor,
        action="webhook.delete",
        target_type="webhook",
        target_id=str(webhook.pk),
        data={"url": webhook.url},
    )
    webhook.delete()


def notification_send(tenant: Tenant | int, *, event: str, data: dict[str, Any]) -> list[WebhookDelivery]:
    """Record a delivery of ``event`` for every webhook of the tenant that asked for it, and send
    each once the current transaction commits (nothing is sent for a change that rolls back)."""
    if event not in EVENTS:
        raise ValueError(f"unknown event {event!r}")
    tenant_id = tenant if isinstance(tenant, int) else tenant.pk
    webhooks = [w for w in Webhook.objects.filter(tenant_id=tenant_id) if event in w.events]
    if not webhooks:
        return []
    now = timezone.now()
    payload = {"event": event, "occurred_at": now.isoformat(), "data": data}
    deliveries = WebhookDelivery.objects.bulk_create(
        [
            WebhookDelivery(tenant_id=tenant_id, webhook=w, event=event, payload=payload, next_attempt_at=now)
            for w in webhooks
        ]
    )
    for delivery in deliveries:
        enqueue_on_commit("workers.notifications.webhook_deliver", delivery.pk)
    return deliveries


def signature(secret: str, timestamp: str, body: bytes) -> str:
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def webhook_deliver(delivery_id: int) -> str:
    """One attempt at a pending delivery: its status after it (pending means a retry is queued)."""
    with transaction.atomic():
        delivery = (
            WebhookDelivery.objects.select_for_update(skip_locked=True)
            .select_related("webhook")
            .filter(pk=delivery_id, status=WebhookDelivery.Status.PENDING)
            .first()
        )
        if delivery is None:
            return "skipped"  # delivered, failed, deleted, or another worker holds it now
        delivery.attempts += 1
        body = json.dumps({"id": delivery.pk, **delivery.payload}, separators=(",", ":")).encode()
        ok, status, error = _post(delivery.webhook, delivery, body)
        delivery.response_status, delivery.error = status, error[:500]
        if ok:
            delivery.status, delivery.delivered_at, delivery.next_attempt_at = (
                WebhookDelivery.Status.DELIVERED,
                timezone.now(),
                None,
            )
        elif delivery.attempts >= settings.STROP_WEBHOOK_MAX_ATTEMPTS:
            delivery.status, delivery.next_attempt_at = WebhookDelivery.Status.FAILED, None
        else:
            wait = BACKOFF_S[min(delivery.attempts - 1, len(BACKOFF_S) - 1)]
            delivery.next_attempt_at = timezone.now() + timedelta(seconds=wait)
            enqueue_on_commit("workers.notifications.webhook_deliver", delivery.pk, countdown=wait)
        delivery.save()
    return delivery.status


def _post(webhook: Webhook, delivery: WebhookDelivery, body: bytes) -> tuple[bool, int | None, str]:
    problem = webhook_address_problem(webhook.url)
    if problem:
        return False, None, f"not sent: the url {problem}"
    timestamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Strop-Webhooks/1",
        "X-Strop-Event": delivery.event,
        "X-Strop-Delivery": str(delivery.pk),
        "X-Strop-Timestamp": timestamp,
        "X-Strop-Signature": signature(webhook.secret, timestamp, body),
    }
    try:
        response = httpx.post(
            webhook.url, content=body, headers=headers, timeout=settings.STROP_WEBHOOK_TIMEOUT_S, follow_redirects=False
        )
    except httpx.HTTPError as exc:
        return False, None, f"{type(exc).__name__}: {exc}"
    if 200 <= response.status_code < 300:
        return True, response.status_code, ""
    return False, response.status_code, f"answered {response.status_code}"


def webhook_deliveries_resend(*, older_than_s: int = 60) -> list[int]:
    """Beat: send again every pending delivery whose attempt is overdue (its message was lost)."""
    cutoff = timezone.now() - timedelta(seconds=older_than_s)
    ids = list(
        WebhookDelivery.objects.filter(status=WebhookDelivery.Status.PENDING, next_attempt_at__lt=cutoff).values_list(
            "pk", flat=True
        )[:500]
    )
    for delivery_id in ids:
        enqueue("workers.notifications.webhook_deliver", delivery_id)
    return ids
