"""The dashboard's figures about an adapter's traffic, aggregated in SQL (one query each).

Definitions, stated once here and on the overview page:

* a *request* is one interaction attributed to the adapter (training's attribution rule);
* a *suggestion* is a request whose completion is not empty (empty = the model chose silence);
* a suggestion was *shown* when its feedback is accepted, rejected, edited or partial
  (``SHOWN_OUTCOMES``): ``not_shown`` and requests without feedback are not shown;
* **acceptance rate** = accepted / shown (= accepted / (accepted + rejected + edited + partial): a
  partial accept was seen and is not an accept);
* suggestions per request and accepted per request divide by every request;
* **mean reward per request** = the adapter's TrainingPolicy reward of each labelled request
  (``apps.interactions.rewards``), averaged over labelled requests: those without feedback yet are
  worth 0 and are not in the denominator.

Where the figures come from: hours and days read the rollups (``apps.interactions.rollups``), never
raw rows, so a page costs the same after a year as after a day; beat refreshes them every few seconds
(a page shows hours as of that refresh, never recomputes them itself). Only the last hour and the
per-minute arrivals read raw rows, by the ``received_at`` / ``updated_at`` indexes: what arrived in
the last hour (an interaction served then arrived then too; a client clock far ahead is the
exception), bounded by a tenant's rate, not by its history.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db.models import Count, F, Q, QuerySet, Sum
from django.db.models.functions import Trunc, TruncMinute
from django.utils import timezone

from apps.adapters.models import Adapter, AdapterVersion
from apps.interactions.models import SHOWN_OUTCOMES, Feedback, Interaction, InteractionRollup
from apps.interactions.rewards import reward_expression, reward_value
from apps.tenants.models import AuditEvent
from apps.training.models import ACTIVE_STATUSES, TrainingPolicy, TrainingRun
from apps.training.selectors import feedback_belongs_to_adapter, interaction_belongs_to_adapter

Outcome = Feedback.Outcome


@dataclass(frozen=True)
class TimeRange:
    key: str
    label: str
    span: timedelta
    bucket: str  # a Trunc kind
    step: timedelta


TIME_RANGES = {
    r.key: r
    for r in (
        TimeRange("1h", "last hour", timedelta(hours=1), "minute", timedelta(minutes=1)),
        TimeRange("24h", "last 24 hours", timedelta(hours=24), "hour", timedelta(hours=1)),
        TimeRange("7d", "last 7 days", timedelta(days=7), "hour", timedelta(hours=1)),
        TimeRange("30d", "last 30 days", timedelta(days=30), "day", timedelta(days=1)),
    )
}
DEFAULT_RANGE = "24h"


@dataclass(frozen=True)
class Rates:
    """Counts of one window and the ratios the dashboard shows (None where a ratio has no denominator)."""

    requests: int = 0
    suggestions: int = 0
    shown: int = 0
    accepted: int = 0
    labelled: int = 0
    reward_sum: float = 0.0

    @classmethod
    def from_row(cls, row: Mapping[str, Any], prefix: str = "") -> Rates:
        return cls(**{name: row[prefix + name] or 0 for name in _COUNT_NAMES})

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.shown if self.shown else None

    @property
    def suggestions_per_request(self) -> float | None:
        return self.suggestions / self.requests if self.requests else None

    @property
    def accepted_per_request(self) -> float | None:
        return self.accepted / self.requests if self.requests else None

    @property
    def mean_reward(self) -> float | None:
        return self.reward_sum / self.labelled if self.labelled else None


_COUNT_NAMES = ("requests", "suggestions", "shown", "accepted", "labelled", "reward_sum")


def _rollup_rates(
    adapter: Adapter, *, policy: TrainingPolicy, period: str, since: datetime, until: datetime
) -> dict[datetime, Rates]:
    """Rates per rollup bucket of ``period`` starting in [since, until], the adapter's rows only."""
    rows = (
        InteractionRollup.objects.filter(
            tenant_id=adapter.tenant_id, period=period, bucket_start__gte=since, bucket_start__lte=until
        )
        .filter(interaction_belongs_to_adapter(adapter))
        .values("bucket_start", "outcome")
        .annotate(n=Sum("requests"), suggested=Sum("suggestions"), weight=Sum("reward_weight"))
        .order_by()
    )
    table = policy.reward_table()
    counts: dict[datetime, dict[str, float]] = {}
    for row in rows:
        c = counts.setdefault(row["bucket_start"], dict.fromkeys(_COUNT_NAMES, 0))
        outcome = row["outcome"] or None
        c["requests"] += row["n"]
        c["suggestions"] += row["suggested"]
        if outcome in SHOWN_OUTCOMES:
            c["shown"] += row["suggested"]
        if outcome == Outcome.ACCEPTED:
            c["accepted"] += row["suggested"]
        if outcome is not None:
            c["labelled"] += row["n"]
            c["reward_sum"] += reward_value(table, outcome=outcome, weight=row["weight"])
    return {start: Rates(**c) for start, c in counts.items()}  # type: ignore[arg-type]


def _rates_sum(rates: list[Rates]) -> Rates:
    return Rates(**{name: sum(getattr(r, name) for r in rates) for name in _COUNT_NAMES})


def adapter_interactions(adapter: Adapter) -> QuerySet[Interaction]:
    return Interaction.objects.filter(tenant_id=adapter.tenant_id).filter(interaction_belongs_to_adapter(adapter))


def _rate_aggregates(policy: TrainingPolicy, *, within: Q | None = None, prefix: str = "") -> dict[str, Any]:
    """Filtered aggregates over interactions LEFT JOIN their (at most one) feedback row."""
    within = within if within is not None else Q()
    suggested = ~Q(completion="")
    reward = reward_expression(policy.reward_table())
    return {
        f"{prefix}requests": Count("id", filter=within),
        f"{prefix}suggestions": Count("id", filter=within & suggested),
        f"{prefix}shown": Count("id", filter=within & suggested & Q(feedback__outcome__in=SHOWN_OUTCOMES)),
        f"{prefix}accepted": Count("id", filter=within & suggested & Q(feedback__outcome=Outcome.ACCEPTED)),
        f"{prefix}labelled": Count("feedback__id", filter=within),
        f"{prefix}reward_sum": Sum(reward, filter=within),
    }


@dataclass(frozen=True)
class Bucket:
    start: datetime
    rates: Rates


@dataclass(frozen=True)
class Marker:
    """A production change on the time axis: ``label`` went live at ``at``."""

    at: datetime
    label: str
    title: str


@dataclass(frozen=True)
class Timeseries:
    range: TimeRange
    since: datetime
    until: datetime
    buckets: list[Bucket]
    markers: list[Marker]

    def series(self, name: str) -> list[tuple[datetime, float | None]]:
        return [(b.start, getattr(b.rates, name)) for b in self.buckets]


def _floor(moment: datetime, kind: str) -> datetime:
    moment = moment.astimezone(UTC).replace(second=0, microsecond=0)
    if kind in ("hour", "day"):
        moment = moment.replace(minute=0)
    if kind == "day":
        moment = moment.replace(hour=0)
    return moment


def adapter_timeseries(
    adapter: Adapter, *, policy: TrainingPolicy, range_key: str = DEFAULT_RANGE, now: datetime | None = None
) -> Timeseries:
    """Rates per time bucket (by when each request was served), every bucket present, and promotions."""
    time_range = TIME_RANGES.get(range_key, TIME_RANGES[DEFAULT_RANGE])
    until = now or timezone.now()
    first = _floor(until - time_range.span, time_range.bucket) + time_range.step
    if time_range.bucket == "minute":  # the last hour's arrivals, by the received_at index
        rows = (
            adapter_interactions(adapter)
            .filter(received_at__gte=first, served_at__gte=first, served_at__lte=until)
            .annotate(bucket=Trunc("served_at", time_range.bucket, tzinfo=UTC))
            .values("bucket")
            .annotate(**_rate_aggregates(policy))
            .order_by("bucket")
        )
        by_start = {row["bucket"]: Rates.from_row(row) for row in rows}
    else:
        by_start = _rollup_rates(adapter, policy=policy, period=time_range.bucket, since=first, until=until)
    buckets, start = [], first
    while start <= until:
        buckets.append(Bucket(start=start, rates=by_start.get(start, Rates())))
        start += time_range.step
    return Timeseries(
        range=time_range, since=first, until=until, buckets=buckets, markers=promotion_markers(adapter, since=first)
    )


def promotion_markers(adapter: Adapter, *, since: datetime) -> list[Marker]:
    """Production changes are the audit events ``adapter.promote``, which name the versions by vLLM name."""
    events = list(
        AuditEvent.objects.filter(
            tenant_id=adapter.tenant_id,
            action="adapter.promote",
            target_type="adapter",
            target_id=adapter.name,
            created_at__gte=since,
        )
        .order_by("created_at")
        .values("created_at", "data", "actor")
    )
    if not events:
        return []
    names = {e["data"].get("to") for e in events} | {e["data"].get("from") for e in events}
    numbers = dict(
        AdapterVersion.objects.filter(adapter=adapter, vllm_name__in=[n for n in names if n]).values_list(
            "vllm_name", "number"
        )
    )

    def label(name: str | None) -> str:
        return f"v{numbers[name]}" if name in numbers else "base model"

    return [
        Marker(
            at=e["created_at"],
            label=label(e["data"].get("to")),
            title=f"{label(e['data'].get('from'))} → {label(e['data'].get('to'))} by {e['actor']}",
        )
        for e in events
    ]


@dataclass(frozen=True)
class LiveNumbers:
    """The headline figures that refresh every few seconds."""

    last_hour: Rates
    last_day: Rates
    interactions_per_minute: list[int]
    feedback_per_minute: list[int]
    minutes: int

    @property
    def interactions_rate(self) -> float:
        recent = self.interactions_per_minute[-RECENT_MINUTES:]
        return sum(recent) / len(recent) if recent else 0.0

    @property
    def feedback_rate(self) -> float:
        recent = self.feedback_per_minute[-RECENT_MINUTES:]
        return sum(recent) / len(recent) if recent else 0.0


SPARK_MINUTES = 30
RECENT_MINUTES = 5


def adapter_live_numbers(adapter: Adapter, *, policy: TrainingPolicy, now: datetime | None = None) -> LiveNumbers:
    now = now or timezone.now()
    hour_ago = now - timedelta(hours=1)
    # One pass over the last hour's arrivals (raw, by the received_at index): the last hour's rates
    # and the interactions per minute of the sparkline. The last day: its 24 hourly rollups.
    first_minute = _floor(now, "minute") - timedelta(minutes=SPARK_MINUTES - 1)
    served_last_hour = Q(served_at__gte=hour_ago, served_at__lte=now)
    per_minute = list(
        adapter_interactions(adapter)
        .filter(received_at__gte=min(hour_ago, first_minute))
        .annotate(minute=TruncMinute("received_at", tzinfo=UTC))
        .values("minute")
        .annotate(arrived=Count("id"), **_rate_aggregates(policy, within=served_last_hour))
        .order_by()
    )
    last_hour = _rates_sum([Rates.from_row(row) for row in per_minute])
    arrivals = {row["minute"]: row["arrived"] for row in per_minute}
    interactions = [arrivals.get(first_minute + timedelta(minutes=i), 0) for i in range(SPARK_MINUTES)]
    first_hour = _floor(now, "hour") - timedelta(hours=23)
    last_day = _rates_sum(
        list(_rollup_rates(adapter, policy=policy, period="hour", since=first_hour, until=now).values())
    )
    # Feedback arrivals per minute over the last half hour, as last updated.
    feedback = _per_minute(
        Feedback.objects.filter(
            tenant_id=adapter.tenant_id, interaction__isnull=False, updated_at__gte=first_minute
        ).filter(feedback_belongs_to_adapter(adapter)),
        "updated_at",
        first_minute,
    )
    return LiveNumbers(
        last_hour=last_hour,
        last_day=last_day,
        interactions_per_minute=interactions,
        feedback_per_minute=feedback,
        minutes=SPARK_MINUTES,
    )


def _per_minute(qs: QuerySet[Any], column: str, first_minute: datetime) -> list[int]:
    counts = dict(
        qs.annotate(minute=TruncMinute(column, tzinfo=UTC))
        .values("minute")
        .annotate(n=Count("pk"))
        .values_list("minute", "n")
    )
    return [counts.get(first_minute + timedelta(minutes=i), 0) for i in range(SPARK_MINUTES)]


def adapter_active_run(adapter: Adapter) -> TrainingRun | None:
    return (
        TrainingRun.objects.filter(adapter=adapter, status__in=ACTIVE_STATUSES)
        .select_related("parent_version")
        .order_by("-created_at")
        .first()
    )


def adapter_last_finished_run(adapter: Adapter) -> TrainingRun | None:
    return (
        TrainingRun.objects.filter(adapter=adapter)
        .exclude(status__in=ACTIVE_STATUSES)
        .select_related("output_version")
        .order_by(F("finished_at").desc(nulls_last=True), "-id")
        .first()
    )
