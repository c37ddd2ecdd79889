from __future__ import annotations

from django.db.models import QuerySet

from apps.common.exceptions import NotFound
from apps.common.parsing import parse_id
from apps.tenants.models import ApiKey, AuditEvent, Tenant


def api_key_find_by_prefix(*, prefix: str) -> ApiKey | None:
    return ApiKey.objects.select_related("tenant").filter(prefix=prefix).first()


def api_key_list(tenant: Tenant) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(tenant=tenant).order_by("-created_at")


def api_key_get_for_tenant(tenant: Tenant, *, key_id: int | str) -> ApiKey:
    try:
        return ApiKey.objects.get(tenant=tenant, pk=parse_id(key_id, what="API key"))
    except ApiKey.DoesNotExist:
        raise NotFound(f"API key {key_id} not found") from None


def audit_event_list(tenant: Tenant) -> QuerySet[AuditEvent]:
    return AuditEvent.objects.filter(tenant=tenant).order_by("-created_at", "-id")
