from __future__ import annotations

from celery import shared_task


@shared_task(name="workers.notifications.webhook_deliver", acks_late=True, expires=24 * 3600)
def webhook_deliver(delivery_id: int) -> str:
    """One attempt at a webhook delivery (idempotent: only a pending delivery is sent, under a row lock)."""
    from apps.notifications.services import webhook_deliver as deliver

    return deliver(delivery_id)


@shared_task(name="workers.notifications.webhook_deliveries_resend", acks_late=True, expires=120)
def webhook_deliveries_resend() -> int:
    """Beat: pending deliveries whose attempt is overdue are sent again."""
    from apps.notifications.services import webhook_deliveries_resend as resend

    return len(resend())
