from __future__ import annotations

from celery import shared_task
from django.conf import settings

# The webhooks queue's limits back the delivery's own deadline (STROP_WEBHOOK_TIMEOUT_S bounds the
# whole HTTP exchange): the soft one raises in the task, which records the attempt and its retry; the
# hard one kills the pool process (only a prefork pool enforces them: the Procfile's worker-webhooks).
# apps.notifications.services.deliveries.claim_lease_s() is longer, so only a dead worker's claim lapses.
DELIVER_SOFT_LIMIT_S = settings.STROP_WEBHOOK_TIMEOUT_S + 15
DELIVER_HARD_LIMIT_S = settings.STROP_WEBHOOK_TIMEOUT_S + 30


@shared_task(
    name="workers.notifications.webhook_deliver",
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=DELIVER_SOFT_LIMIT_S,
    time_limit=DELIVER_HARD_LIMIT_S,
    expires=24 * 3600,
)
def webhook_deliver(delivery_id: int) -> str:
    """One attempt at a webhook delivery (webhooks queue). Idempotent: only a due delivery is
    claimed, and its retry (capped exponential backoff) is queued by the service that records it."""
    from apps.notifications.services import webhook_deliver as deliver

    return deliver(delivery_id).status


@shared_task(name="workers.notifications.webhook_deliveries_resend", acks_late=True, expires=120)
def webhook_deliveries_resend() -> int:
    """Beat: overdue pending deliveries, and those whose worker died mid-attempt, are sent again."""
    from apps.notifications.services import webhook_deliveries_resend as resend

    return len(resend())
