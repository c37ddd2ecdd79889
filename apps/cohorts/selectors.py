"""Reads of end users, and the one consent rule.

The rule (one place, used by training eligibility and by randomisation): an event trains only if
its end user was opted in when it happened (``Interaction.end_user_opted_in``, recorded then)
*and* is still opted in now (``EndUser.opted_in``). Opting out withdraws consent for every later
run; opting back in does not resurrect events that happened while opted out.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Exists, OuterRef, Q, QuerySet

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


# The shortest search for any part of an id; a shorter one matches the id's start (see end_user_list).
SEARCH_MIN_CHARS = 3


def end_user_list(tenant: Tenant, *, search: str | None = None, opted_in: bool | None = None) -> QuerySet[EndUser]:
    """By external id. ``search`` (any case) matches any part of the id, or only its start when
    shorter than ``SEARCH_MIN_CHARS``: on Postgres both are served by a trigram index on
    ``UPPER(external_id)`` (migration 0004), the order by the ``(tenant, external_id)`` one. A
    trigram index cannot serve a substring under 3 characters (such a search that matched few
    users would read every one of the tenant's); it can serve the start of the id."""
    users = EndUser.objects.filter(tenant=tenant)
    if search and len(search) < SEARCH_MIN_CHARS:
        users = users.filter(external_id__istartswith=search)
    elif search:
        users = users.filter(external_id__icontains=search)
    if opted_in is not None:
        users = users.filter(opted_in=opted_in)
    return users.order_by("external_id")


COUNT_CAP = 10_000


@dataclass(frozen=True)
class CappedCount:
    """A count that stops at a cap (``COUNT_CAP``): ``more`` says there are more than ``value``."""

    value: int
    more: bool


def capped_count(rows: QuerySet[EndUser], *, cap: int | None = COUNT_CAP) -> CappedCount:
    """How many ``rows`` there are, counted up to ``cap``: a read of at most ``cap + 1`` of them
    (None: all of them, exactly, at the cost of reading every one)."""
    if cap is None:
        return CappedCount(value=rows.order_by().count(), more=False)
    n = rows.order_by()[: cap + 1].count()
    return CappedCount(value=min(n, cap), more=n > cap)


def end_user_counts_capped(tenant: Tenant, *, cap: int | None = COUNT_CAP) -> dict[str, CappedCount]:
    """The tenant's end users (``total``), opted in and opted out, each counted up to ``cap``: a
    read of at most ``cap + 1`` index entries per figure, however many users the tenant holds
    (``cap=None``: exact, reading every one)."""
    users = EndUser.objects.filter(tenant=tenant)
    figures = {"total": users, "opted_in": users.filter(opted_in=True), "opted_out": users.filter(opted_in=False)}
    return {name: capped_count(rows, cap=cap) for name, rows in figures.items()}


@dataclass(frozen=True)
class EndUserPage:
    object_list: list[EndUser]
    next: str | None  # the cursor of the next page (the last external id shown), None on the last
    first: bool


def end_user_page(users: QuerySet[EndUser], *, after: str | None, per_page: int, offset: int = 0) -> EndUserPage:
    """The ``per_page`` users of ``users`` (ordered by external id) after the external id ``after``
    (a page's ``next``): no count, no offset, so the hundredth page costs what the first does.
    ``offset`` skips that many more (the API's offset pages, each costing what it skips). A cursor
    no page could have given (a NUL byte, which Postgres refuses in text) starts from the first page."""
    if after and "\x00" in after:
        after = None
    if after:
        users = users.filter(external_id__gt=after[:200])
    rows = list(users[offset : offset + per_page + 1])
    following = rows[per_page - 1].external_id if len(rows) > per_page else None
    return EndUserPage(object_list=rows[:per_page], next=following, first=not after and not offset)


def consent_history(end_user: EndUser) -> QuerySet[ConsentChange]:
    return end_user.consent_history.order_by("-changed_at", "-id")
