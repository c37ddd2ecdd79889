"""Reads of end users, and the one consent rule.

The rule (one place, used by training eligibility and by randomisation): an event trains only if
its end user was opted in when it happened (``Interaction.end_user_opted_in``, recorded then)
*and* is still opted in now (``EndUser.opted_in``). Opting out withdraws consent for every later
run; opting back in does not resurrect events that happened while opted out.
"""

from __future__ import annotations

from django.db.models import Count, Exists, OuterRef, Q, QuerySet

from apps.cohorts.models import ConsentChange, EndUser
from apps.common.exceptions import NotFound
from apps.tenants.models import ApiKey, Tenant


def consent_default(tenant: Tenant, *, api_key: ApiKey | None = None) -> bool:
    """Consent of an end user seen for the first time with no flag: the key's default, else the tenant's."""
    if api_key is not None and api_key.default_opt_in is not None:
        return api_key.default_opt_in
    return tenant.default_opt_in


def consented_events(prefix: str = "interaction__") -> Q:
    """The consent rule as a filter on rows that reach an Interaction through ``prefix``
    ("" for Interaction itself, "interaction__" for Feedback)."""
    still_opted_in = EndUser.objects.filter(
        tenant_id=OuterRef(f"{prefix}tenant_id"), external_id=OuterRef(f"{prefix}end_user_id"), opted_in=True
    )
    return Q(**{f"{prefix}end_user_opted_in": True}) & Q(Exists(still_opted_in))


def end_user_get_for_tenant(tenant: Tenant, *, external_id: str) -> EndUser:
    user = EndUser.objects.filter(tenant=tenant, external_id=external_id).first()
    if user is None:
        raise NotFound(f"no end user {external_id[:200]!r}")
    return user


def end_user_list(tenant: Tenant, *, search: str | None = None, opted_in: bool | None = None) -> QuerySet[EndUser]:
    users = EndUser.objects.filter(tenant=tenant)
    if search:
        users = users.filter(external_id__icontains=search)
    if opted_in is not None:
        users = users.filter(opted_in=opted_in)
    return users.order_by("external_id")


def end_user_counts(tenant: Tenant) -> dict[str, int]:
    counts = EndUser.objects.filter(tenant=tenant).aggregate(
        total=Count("id"), opted_in=Count("id", filter=Q(opted_in=True))
    )
    return {"total": counts["total"], "opted_in": counts["opted_in"], "opted_out": counts["total"] - counts["opted_in"]}


def consent_history(end_user: EndUser) -> QuerySet[ConsentChange]:
    return end_user.consent_history.order_by("-changed_at", "-id")
