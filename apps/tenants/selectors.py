from __future__ import annotations

from django.db import connection
from django.db.models import QuerySet

from apps.common.exceptions import NotFound
from apps.common.lookups import joined_row, model_columns
from apps.common.parsing import parse_id
from apps.tenants.models import ApiKey, AuditEvent, Tenant


def api_key_find_by_prefix(*, prefix: str) -> ApiKey | None:
    """The key with this prefix and its tenant, read fresh on every request (a revoked key stops
    working at once), in one plain query: authentication runs on every API call."""
    key_table, tenant_table = (connection.ops.quote_name(m._meta.db_table) for m in (ApiKey, Tenant))
    found = joined_row(
        f"SELECT {model_columns(ApiKey, 'k')}, {model_columns(Tenant, 't')} FROM {key_table} k "
        f"JOIN {tenant_table} t ON t.id = k.tenant_id WHERE k.prefix = %s",
        [prefix],
        (ApiKey, Tenant),
    )
    if found is None:
        return None
    api_key, api_key.tenant = found
    return api_key


def api_key_list(tenant: Tenant) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(tenant=tenant).order_by("-created_at")


def api_key_get_for_tenant(tenant: Tenant, *, key_id: int | str) -> ApiKey:
    try:
        return ApiKey.objects.get(tenant=tenant, pk=parse_id(key_id, what="API key"))
    except ApiKey.DoesNotExist:
        raise NotFound(f"API key {key_id} not found") from None


def audit_event_list(tenant: Tenant) -> QuerySet[AuditEvent]:
    return AuditEvent.objects.filter(tenant=tenant).order_by("-created_at", "-id")
