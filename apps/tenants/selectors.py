from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection
from django.db.models import Case, IntegerField, QuerySet, Value, When
from django.utils import timezone

from apps.common.exceptions import NotFound
from apps.common.lookups import Read, joined_rows, model_columns
from apps.common.parsing import parse_id
from apps.tenants.keys import hash_key
from apps.tenants.models import ApiKey, AuditEvent, Invitation, Membership, Tenant


def api_key_find_with(*, prefix: str, also: Sequence[Read]) -> tuple[ApiKey | None, list[list[Any] | None]]:
    """The key with this prefix and its tenant, read fresh on every request (a revoked key stops
    working at once) in one plain query, authentication running on every API call; and the rows
    of ``also``, other reads sent in the same round trip (``joined_rows``), each naming the key's
    tenant by ``tenant_of_key_sql()`` with ``prefix`` as its parameter: what a request reads next,
    read before the key is checked. Their rows are the key's tenant's, and only for a caller whose
    key then proves valid."""
    key_table, tenant_table = (connection.ops.quote_name(m._meta.db_table) for m in (ApiKey, Tenant))
    found, *rows = joined_rows(
        [
            (
                f"SELECT {model_columns(ApiKey, 'k')}, {model_columns(Tenant, 't')} FROM {key_table} k "
                f"JOIN {tenant_table} t ON t.id = k.tenant_id WHERE k.prefix = %s",
                [prefix],
                (ApiKey, Tenant),
            ),
            *also,
        ]
    )
    if found is None:
        return None, rows
    api_key, api_key.tenant = found
    return api_key, rows


def tenant_of_key_sql() -> str:
    """The id of the tenant whose API key has the prefix given as the parameter, as a subquery."""
    return f"(SELECT kt.tenant_id FROM {connection.ops.quote_name(ApiKey._meta.db_table)} kt WHERE kt.prefix = %s)"


def api_key_list(tenant: Tenant) -> QuerySet[ApiKey]:
    return ApiKey.objects.filter(tenant=tenant).order_by("-created_at")


def api_key_get_for_tenant(tenant: Tenant, *, key_id: int | str) -> ApiKey:
    try:
        return ApiKey.objects.get(tenant=tenant, pk=parse_id(key_id, what="API key"))
    except ApiKey.DoesNotExist:
        raise NotFound(f"API key {key_id} not found") from None


def audit_event_list(tenant: Tenant) -> QuerySet[AuditEvent]:
    return AuditEvent.objects.filter(tenant=tenant).order_by("-created_at", "-id")


_ROLE_RANK = Case(
    *(When(role=role, then=Value(rank)) for rank, role in enumerate(Membership.Role.values)),
    output_field=IntegerField(),
)


def membership_list(tenant: Tenant) -> QuerySet[Membership]:
    """The tenant's team: owners first, then admins, then viewers, each by username."""
    return (
        Membership.objects.filter(tenant=tenant)
        .select_related("user")
        .order_by(_ROLE_RANK, "user__username", "pk")
    )


def membership_get_for_tenant(tenant: Tenant, *, membership_id: int | str) -> Membership:
    try:
        return Membership.objects.select_related("user").get(
            tenant=tenant, pk=parse_id(membership_id, what="member")
        )
    except Membership.DoesNotExist:
        raise NotFound(f"member {membership_id} not found") from None


def membership_owner_count(tenant: Tenant) -> int:
    return Membership.objects.filter(tenant=tenant, role=Membership.Role.OWNER).count()


def invitation_list_pending(tenant: Tenant) -> QuerySet[Invitation]:
    """Invitations that can still be accepted, the newest first."""
    return (
        Invitation.objects.filter(
            tenant=tenant, used_at__isnull=True, revoked_at__isnull=True, expires_at__gt=timezone.now()
        )
        .select_related("created_by")
        .order_by("-created_at", "-pk")
    )


def invitation_get_for_tenant(tenant: Tenant, *, invitation_id: int | str) -> Invitation:
    try:
        return Invitation.objects.get(tenant=tenant, pk=parse_id(invitation_id, what="invitation"))
    except Invitation.DoesNotExist:
        raise NotFound(f"invitation {invitation_id} not found") from None


def invitation_get_by_token(raw_token: str) -> Invitation | None:
    """The invitation a link's token opens, whatever its state (the caller says why it is unusable);
    None for a token no invitation has. Only the token's keyed hash is looked up."""
    if not raw_token or len(raw_token) > 200:
        return None
    return Invitation.objects.select_related("tenant").filter(token_hash=hash_key(raw_token)).first()
