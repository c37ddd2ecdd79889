"""Deliveries: a tenant's endpoints hear about experiments decided, versions promoted or rolled
back, and training runs failed or rejected.

Every delivery is a row before it is sent (``notification_send``, in the transaction of the change
it reports), so none is lost when the worker or the broker is down. A worker of the ``webhooks``
queue sends it (``webhook_deliver``) in three steps, so that no transaction and no row lock is
held while a tenant's receiver takes its time:

1. a short transaction claims the delivery (``sending``, one more attempt, ``claimed_at``) and
   commits;
2. the POST runs outside any transaction, to the address vetted once (``transport.post_pinned``),
   within one total deadline (STROP_WEBHOOK_TIMEOUT_S) and reading at most
   STROP_WEBHOOK_MAX_RESPONSE_BYTES of the answer;
3. a second short transaction records the outcome: delivered, failed after
   STROP_WEBHOOK_MAX_ATTEMPTS, or pending again after a capped exponential backoff, its retry
   queued when that commits.

A claim whose worker died is taken over once it is older than ``CLAIM_LEASE_S`` (longer than the
task's hard time limit), and beat resends what is overdue. Receivers deduplicate on
``X-Strop-Delivery``: a delivery may arrive twice, never zero times.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from apps.common.stored_secrets import SecretUnreadable
from apps.common.tasks import enqueue, enqueue_on_commit
from apps.notifications.addresses import AddressRefused, Resolver, system_resolver
from apps.notifications.models import EVENTS, Webhook, WebhookDelivery
from apps.notifications.services.webhooks import signature_header, webhook_url_addresses, webhook_url_problem
from apps.notifications.transport import PostResult, post_pinned
from apps.tenants.models import Tenant

logger = logging.getLogger(__name__)

DELIVER_TASK = "workers.notifications.webhook_deliver"
BACKOFF_FACTOR = 5  # 10 s, 50 s, ~4 min, ~21 min, then the cap (STROP_WEBHOOK_RETRY_MAX_S)
# A message may run a little before its delivery's next_attempt_at (another host's clock).
EARLY_TOLERANCE_S = 5


def claim_lease_s() -> float:
    """How long a claim holds before another worker may take the delivery over: past the task's
    hard time limit (workers/notifications.py), so only a dead worker's claim is ever taken."""
    return settings.STROP_WEBHOOK_TIMEOUT_S + 90


def retry_backoff_s(attempts: int) -> float:
    """The wait before the attempt after ``attempts`` failed ones: exponential, capped."""
    wait = settings.STROP_WEBHOOK_RETRY_BASE_S * BACKOFF_FACTOR ** max(attempts - 1, 0)
    return float(min(wait, settings.STROP_WEBHOOK_RETRY_MAX_S))


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
        enqueue_on_commit(DELIVER_TASK, delivery.pk)
    return deliveries


@dataclass(frozen=True)
class DeliveryAttempt:
    """A delivery's status after one call of ``webhook_deliver`` ("skipped" when it was not this
    call's to send), and the wait before its retry when one is queued."""

    status: str
    retry_in: float | None = None


def webhook_delivery_claim(delivery_id: int) -> WebhookDelivery | None:
    """Step 1: mark the delivery ``sending`` with one more attempt, and commit. None when it is not
    due: delivered, failed, deleted, not yet time, or claimed by a worker that is still within its
    lease. A dead worker's claim with no attempt left ends the delivery failed."""
    now = timezone.now()
    due = Q(status=WebhookDelivery.Status.PENDING) & (
        Q(next_attempt_at__isnull=True) | Q(next_attempt_at__lte=now + timedelta(seconds=EARLY_TOLERANCE_S))
    )
    abandoned = Q(status=WebhookDelivery.Status.SENDING, claimed_at__lt=now - timedelta(seconds=claim_lease_s()))
    with transaction.atomic():
        delivery = (
            WebhookDelivery.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("webhook")
            .filter(due | abandoned, pk=delivery_id)
            .first()
        )
        if delivery is None:
            return None
        if delivery.attempts >= settings.STROP_WEBHOOK_MAX_ATTEMPTS:
            delivery.status, delivery.claimed_at, delivery.next_attempt_at = WebhookDelivery.Status.FAILED, None, None
            delivery.error = "the worker stopped during the last attempt"
            delivery.save(update_fields=["status", "claimed_at", "next_attempt_at", "error"])
            return None
        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            status=WebhookDelivery.Status.SENDING, attempts=F("attempts") + 1, claimed_at=now
        )
        delivery.refresh_from_db(fields=["status", "attempts", "claimed_at"])
    return delivery


def webhook_delivery_record(delivery_id: int, *, attempt: int, result: PostResult) -> DeliveryAttempt:
    """Step 3: the outcome of attempt number ``attempt``, unless another worker took the delivery
    over since (its claim lapsed) or it was deleted. A failure is retried after the backoff until
    the last attempt, which ends the delivery failed with its error."""
    with transaction.atomic():
        delivery = (
            WebhookDelivery.objects.select_for_update()
            .filter(pk=delivery_id, status=WebhookDelivery.Status.SENDING, attempts=attempt)
            .first()
        )
        if delivery is None:
            return DeliveryAttempt("skipped")
        now = timezone.now()
        delivery.response_status, delivery.claimed_at = result.status, None
        delivery.error = "" if result.ok else (result.error or f"answered {result.status}")[:500]
        retry_in = None
        if result.ok:
            delivery.status, delivery.delivered_at, delivery.next_attempt_at = (
                WebhookDelivery.Status.DELIVERED,
                now,
                None,
            )
        elif delivery.attempts >= settings.STROP_WEBHOOK_MAX_ATTEMPTS:
            delivery.status, delivery.next_attempt_at = WebhookDelivery.Status.FAILED, None
        else:
            retry_in = retry_backoff_s(delivery.attempts)
            delivery.status, delivery.next_attempt_at = (
                WebhookDelivery.Status.PENDING,
                now + timedelta(seconds=retry_in),
            )
            enqueue_on_commit(DELIVER_TASK, delivery.pk, countdown=retry_in)
        delivery.save()
    return DeliveryAttempt(delivery.status, retry_in)


def webhook_deliver(delivery_id: int, *, resolver: Resolver = system_resolver) -> DeliveryAttempt:
    """One attempt at a delivery: claim, POST (no transaction open), record."""
    delivery = webhook_delivery_claim(delivery_id)
    if delivery is None:
        return DeliveryAttempt("skipped")
    try:
        result = _post(delivery, resolver=resolver)
    except BaseException as exc:  # a time limit, a bug: the attempt still ends recorded (and retried)
        webhook_delivery_record(
            delivery.pk,
            attempt=delivery.attempts,
            result=PostResult(None, f"the attempt stopped: {type(exc).__name__}"),
        )
        raise
    return webhook_delivery_record(delivery.pk, attempt=delivery.attempts, result=result)


def _post(delivery: WebhookDelivery, *, resolver: Resolver) -> PostResult:
    webhook = delivery.webhook
    problem = webhook_url_problem(webhook.url)
    if problem:
        return PostResult(None, f"not sent: the url {problem}")
    try:
        addresses = webhook_url_addresses(webhook.url, resolver=resolver)
    except AddressRefused as exc:
        return PostResult(None, f"not sent: {exc}")
    body = json.dumps({"id": delivery.pk, **delivery.payload}, separators=(",", ":")).encode()
    timestamp = str(int(time.time()))
    try:
        signed = signature_header(webhook, timestamp=timestamp, body=body, now=timezone.now())
    except SecretUnreadable as exc:  # the operator's key changed: their log says which, the tenant's what to do
        logger.error(
            "webhook %s of tenant %s: delivery %s not signed: %s", webhook.pk, webhook.tenant_id, delivery.pk, exc
        )
        return PostResult(None, "not sent: its signing secret cannot be read (ask the operator, or rotate the secret)")
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "Strop-Webhooks/1",
        "X-Strop-Event": delivery.event,
        "X-Strop-Delivery": str(delivery.pk),
        "X-Strop-Timestamp": timestamp,
        "X-Strop-Signature": signed,
    }
    return post_pinned(
        webhook.url,
        host=urlsplit(webhook.url).hostname or "",
        addresses=addresses,
        body=body,
        headers=headers,
        deadline_s=settings.STROP_WEBHOOK_TIMEOUT_S,
        max_response_bytes=settings.STROP_WEBHOOK_MAX_RESPONSE_BYTES,
    )


def webhook_deliveries_resend(*, older_than_s: int = 60) -> list[int]:
    """Beat: send again every pending delivery whose attempt is overdue (its message was lost), and
    every one whose worker died mid-attempt (its claim is past the lease)."""
    now = timezone.now()
    overdue = Q(status=WebhookDelivery.Status.PENDING, next_attempt_at__lt=now - timedelta(seconds=older_than_s))
    abandoned = Q(status=WebhookDelivery.Status.SENDING, claimed_at__lt=now - timedelta(seconds=claim_lease_s()))
    ids = list(WebhookDelivery.objects.filter(overdue | abandoned).values_list("pk", flat=True)[:500])
    for delivery_id in ids:
        enqueue(DELIVER_TASK, delivery_id)
    return ids
