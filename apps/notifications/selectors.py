from __future__ import annotations

from django.db.models import QuerySet

from apps.common.exceptions import NotFound
from apps.notifications.models import Webhook, WebhookDelivery
from apps.tenants.models import Tenant


def webhook_list(tenant: Tenant) -> QuerySet[Webhook]:
    return Webhook.objects.filter(tenant=tenant).order_by("-created_at", "-id")


def webhook_get_for_tenant(tenant: Tenant, *, webhook_id: int | str) -> Webhook:
    webhook = Webhook.objects.filter(tenant=tenant, pk=webhook_id).first() if str(webhook_id).isdigit() else None
    if webhook is None:
        raise NotFound(f"no webhook {str(webhook_id)[:40]!r}")
    return webhook


def webhook_delivery_list(tenant: Tenant, *, limit: int = 50) -> list[WebhookDelivery]:
    """The newest deliveries of every webhook of the tenant: the delivery log."""
    return list(
        WebhookDelivery.objects.filter(tenant=tenant).select_related("webhook").order_by("-created_at", "-id")[:limit]
    )
