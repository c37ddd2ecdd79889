"""Opt-in counts over time, rebuilt from the append-only consent history.

Every change of state writes one history row (a user created opted out writes none, one created
opted in writes an opt-in), so the number opted in at any moment is the running sum of +1 per
opt-in and −1 per opt-out; counting back from today's number makes it exact even when older
history was erased with its users.

Today's number is counted only up to a cap (a count of every user costs what the tenant holds, not
what the page shows): over the cap, each day's level is the change since the window began instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import Count, Q
from django.db.models.functions import TruncDay
from django.utils import timezone

from apps.cohorts.models import ConsentChange
from apps.tenants.models import Tenant


@dataclass(frozen=True)
class ConsentDay:
    day: datetime
    opted_in: int
    opt_ins: int
    opt_outs: int


def optin_over_time(
    tenant: Tenant, *, opted_in_now: int | None, days: int = 30, now: datetime | None = None
) -> list[ConsentDay]:
    """Users opted in at the end of each of the last ``days`` UTC days (today included), with the
    opt-ins and opt-outs of each day: one grouped query. ``opted_in_now`` is today's number; None
    (not counted: over the cap) makes each level the net change since the first day began."""
    now = now or timezone.now()
    today = now.replace(hour=0, minute=0, second=0, microsecond=0)
    first = today - timedelta(days=days - 1)
    rows = (
        ConsentChange.objects.filter(tenant=tenant, changed_at__gte=first)
        .annotate(day=TruncDay("changed_at"))
        .values("day")
        .annotate(ins=Count("id", filter=Q(opted_in=True)), outs=Count("id", filter=Q(opted_in=False)))
    )
    by_day = {row["day"]: (row["ins"], row["outs"]) for row in rows}
    net = sum(ins - outs for ins, outs in by_day.values())
    out: list[ConsentDay] = []
    level = net if opted_in_now is None else opted_in_now
    for offset in range(days):  # newest first, walking back
        day = today - timedelta(days=offset)
        ins, outs = by_day.get(day, (0, 0))
        out.append(ConsentDay(day=day, opted_in=level, opt_ins=ins, opt_outs=outs))
        level -= ins - outs
    return list(reversed(out))
