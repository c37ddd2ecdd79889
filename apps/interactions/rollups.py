"""Hourly and daily rollups of interactions and their feedback: what the dashboard reads.

**How they stay exact.** Every write to interactions or feedback, by whatever path (ingest, serving,
feedback twice, late, pending and attached later, session outcomes spread, replays, erase), marks
the hour the interaction was served in: a database trigger writes a ``RollupDirty`` row in the
writer's own transaction (migration 0010). :func:`rollups_refresh` then *recomputes* each marked
hour of the tenant from the raw rows (delete the hour's rollups, aggregate the hour again) and
rebuilds the days around them from their hours. Recomputing, not adding deltas, is what makes a
repeat harmless: feedback sent twice is one row (last write wins), so the hour counted again counts
it once, and a late or replayed event can only make an hour dirty again, never be added twice.

A mark is deleted by its id once its hour was recomputed in the same transaction, after the marks
were read: a writer that commits after that read leaves a mark this run did not see (the next run
takes it), and one that committed before it is in the rows this run aggregates. Runs of one tenant
take a lock (a Postgres advisory lock), so two never rebuild the same hour at once.

Runs come from beat (``workers.ingest.rollups_refresh_all``, every 5 s): pages read rollups as of
the last run and never aggregate raw history themselves. On an upgrade from before rollups,
migration 0013 marks every hour that has interactions, so refreshes build them a window at a time;
``manage.py rollups_rebuild`` recomputes every hour that still has raw rows at once (or checks them).

Rollups outlive raw rows. Retention, in the transaction that deletes a batch of old interactions,
first adds what they counted to the ledger of their hours (``pruned`` rows, :func:`rollups_pruned_keep`),
and an hour is recomputed as its raw rows plus its ledger. So any hour can be recomputed, before
the cutoff too: late feedback on an old interaction that a running experiment or a training window
keeps moves its hour's rollups as it would a recent one's, and the charts keep the history of rows
that are gone. An erase keeps no ledger: the erased user's rows leave every hour they were in.
Nor does an hour count a row twice: every hour up to the newest in the ledger is settled
(:func:`rollups_settled_before`), and ingest stores no interaction served then, not even one sent
again after retention deleted it.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Case, Count, F, FloatField, Min, Q, QuerySet, Sum, Value, When
from django.db.models.functions import Coalesce, TruncHour
from django.utils import timezone

from apps.interactions.models import LATENCY_BOUNDS_MS, Feedback, Interaction, InteractionRollup, RollupDirty
from apps.tenants.models import Tenant

KEY_FIELDS = ("adapter_id", "model_name", "adapter_version_id", "experiment_id", "experiment_arm", "outcome")
_SUMS = ("requests", "suggestions", "reward_weight", "latency_count", "latency_sum_ms")
logger = logging.getLogger(__name__)

# How many hours one aggregation reads at most (the rebuild walks history in such slices).
HOURS_PER_PASS = 24 * 7
# More separate ranges of marked hours than this in one pass's window, and it recomputes the span they
# cover (at most HOURS_PER_PASS hours).
MAX_RANGES = 24
# How many marks one refresh transaction reads and deletes at most (SQLite bounds the variables of a statement).
MARK_CHUNK = 10_000


def _lock(tenant_id: int, *, shared: bool = False) -> None:
    """The tenant's rollup lock for this transaction (Postgres); the embedded SQLite writes one at a time.
    ``shared``: held beside other shared holders, never beside the lock itself (a refresh, a retention batch)."""
    if connection.vendor != "postgresql":
        return
    take = "pg_advisory_xact_lock_shared" if shared else "pg_advisory_xact_lock"
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {take}(%s)", [zlib.crc32(f"strop:rollups:{tenant_id}".encode())])


def retention_days_effective(days: int | None) -> int | None:
    """The tenant's setting bounded by the operator's maximum (``STROP_RETENTION_MAX_DAYS``, 0: none)."""
    most = int(settings.STROP_RETENTION_MAX_DAYS) or None
    if days is None:
        return most
    return min(days, most) if most else days


def retention_cutoff(tenant_id: int, *, now: datetime | None = None) -> datetime | None:
    """The hour before which the tenant's raw rows are not kept (None: kept forever)."""
    days = retention_days_effective(
        Tenant.objects.filter(pk=tenant_id).values_list("retention_days", flat=True).first()
    )
    if not days:
        return None
    try:
        moment = (now or timezone.now()) - timedelta(days=days)
    except OverflowError:  # before the first year a date holds (a setting from before RETENTION_DAYS_MOST)
        return None
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def rollups_refresh(tenant_id: int) -> int:
    """Recompute the tenant's marked hours from raw rows; returns how many hours.

    One transaction per pass, each bounded: it takes the window of ``HOURS_PER_PASS`` hours from the
    earliest marked hour, reads at most ``MARK_CHUNK`` of its marks (by id), recomputes their hours
    and deletes them; the rest wait for the next pass. Marks written after the run began are left to
    the next run, so a run ends under steady ingest."""
    last = RollupDirty.objects.filter(tenant_id=tenant_id).order_by("-id").values_list("id", flat=True).first()
    done = 0
    while last is not None:
        with transaction.atomic():
            _lock(tenant_id)
            pending = RollupDirty.objects.filter(tenant_id=tenant_id, id__lte=last)
            first = pending.aggregate(first=Min("hour"))["first"]
            if first is None:
                break
            end = _hour(first) + timedelta(hours=HOURS_PER_PASS)
            window = pending.filter(hour__lt=end).order_by("id").values_list("id", "hour")[:MARK_CHUNK]
            taken = [(mark_id, _hour(hour)) for mark_id, hour in window]
            hours = sorted({hour for _, hour in taken})
            _recompute(tenant_id, hours)
            RollupDirty.objects.filter(id__in=[mark_id for mark_id, _ in taken]).delete()
        done += len(hours)
    return done


def rollups_refresh_all() -> int:
    """Beat: refresh every tenant with marked hours. A tenant whose refresh fails is logged and
    retried on the next pass; the others go on (one tenant's data never stops another's charts)."""
    done = 0
    for tenant_id in list(RollupDirty.objects.values_list("tenant_id", flat=True).distinct()):
        try:
            done += rollups_refresh(tenant_id)
        except Exception:
            logger.exception("rollup refresh failed for tenant %s; the next pass retries it", tenant_id)
    return done


def rollups_rebuild(tenant_id: int) -> int:
    """Recompute every hour from the oldest that has raw rows or a ledger (what retention deleted) to
    the newest, dropping rollups of hours in between that have neither. Returns how many hours were
    recomputed."""
    first = Interaction.objects.filter(tenant_id=tenant_id).order_by("served_at").values_list("served_at", flat=True)
    pruned = InteractionRollup.objects.filter(tenant_id=tenant_id, period=InteractionRollup.Period.PRUNED)
    pruned_hours = pruned.order_by("bucket_start").values_list("bucket_start", flat=True)
    oldest = min((m for m in (first.first(), pruned_hours.first()) if m is not None), default=None)
    if oldest is None:
        return 0
    start = _hour(oldest)
    end = _hour(timezone.now()) + timedelta(hours=1)
    for latest in (first.reverse().first(), pruned_hours.reverse().first()):
        end = max(end, _hour(latest) + timedelta(hours=1)) if latest else end
    done = 0
    while start < end:
        hours = [start + timedelta(hours=n) for n in range(HOURS_PER_PASS) if start + timedelta(hours=n) < end]
        with transaction.atomic():
            _lock(tenant_id)
            _recompute(tenant_id, hours)
        done += len(hours)
        start += timedelta(hours=HOURS_PER_PASS)
    return done


def rollups_pruned_keep(tenant_id: int, rows: QuerySet[Interaction]) -> None:
    """Retention, in the transaction that deletes ``rows`` (interactions of the tenant) next: add
    what they count to the ledger of their hours, so their hours keep them when recomputed.

    The rows and their feedback are locked first, in key order: a label changed after this read and
    before the delete would leave the ledger with its old outcome, and a first label (or a pending
    one attached) checks its interaction's key at commit, which now waits for the delete. The
    tenant's rollups lock is held to the commit: a refresh sees the rows or their ledger, never
    both, never neither."""
    _lock(tenant_id)
    list(rows.select_for_update().order_by("pk").values_list("pk"))
    labels = Feedback.objects.select_for_update().filter(tenant_id=tenant_id, interaction__in=rows.values("pk"))
    list(labels.order_by("pk").values_list("pk"))
    InteractionRollup.objects.bulk_create(rollup_rows(tenant_id, rows, period=InteractionRollup.Period.PRUNED))


def rollups_settled_before(tenant_id: int, *, hold: bool = False) -> datetime | None:
    """The end of the newest hour the tenant's ledger holds (None: retention deleted nothing yet).

    Retention has settled every hour before it: what it deleted there is counted in the ledger for
    good. An interaction served then is not stored again (ingest refuses it): kept, the next pass would
    delete it and add it to the ledger a second time if it had been deleted before (a replay), and it
    cannot be told from one that never came. It never moves back, whatever the tenant's retention is
    set to later: the ledger is never deleted.

    ``hold``: the tenant's rollup lock, shared, until the transaction ends. A retention batch takes it
    before it deletes and adds to the ledger, so it has committed before this read, or it waits for the
    caller to commit (and then deletes what the caller stored with the rest, once)."""
    if hold:
        _lock(tenant_id, shared=True)
    newest = (
        InteractionRollup.objects.filter(tenant_id=tenant_id, period=InteractionRollup.Period.PRUNED)
        .order_by("-bucket_start")
        .values_list("bucket_start", flat=True)
        .first()
    )
    return None if newest is None else _hour(newest) + timedelta(hours=1)


def _hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def _day(moment: datetime) -> datetime:
    return _hour(moment).replace(hour=0)


def _ranges(hours: list[datetime]) -> list[tuple[datetime, datetime]]:
    """The (sorted) hours as [start, end) ranges, contiguous hours merged into one."""
    ranges: list[tuple[datetime, datetime]] = []
    for hour in hours:
        if ranges and ranges[-1][1] == hour:
            ranges[-1] = (ranges[-1][0], hour + timedelta(hours=1))
        else:
            ranges.append((hour, hour + timedelta(hours=1)))
    return ranges


def _served_within(ranges: list[tuple[datetime, datetime]]) -> Q:
    q = Q()
    for start, end in ranges:
        q |= Q(served_at__gte=start, served_at__lt=end)
    return q


def _latency_counts() -> dict[str, Count]:
    bounds = (None, *LATENCY_BOUNDS_MS, None)
    counts = {}
    for index, (low, high) in enumerate(zip(bounds, bounds[1:], strict=False)):
        within = Q(latency_ms__isnull=False)
        if low is not None:
            within &= Q(latency_ms__gte=low)
        if high is not None:
            within &= Q(latency_ms__lt=high)
        counts[f"latency_{index}"] = Count("id", filter=within)
    return counts


def _recompute(tenant_id: int, hours: list[datetime]) -> None:
    """The tenant's hourly rollups of ``hours``: their raw rows aggregated, plus their ledgers."""
    if not hours:
        return
    ranges = _ranges(hours)
    hourly = InteractionRollup.objects.filter(tenant_id=tenant_id, period=InteractionRollup.Period.HOUR)
    if len(ranges) > MAX_RANGES:
        # Scattered hours (a bulk load, a backfill): recompute the span they cover in one pass. An hour
        # recomputed without a mark comes out exact all the same; only the cost is extra.
        span = int((hours[-1] - hours[0]).total_seconds()) // 3600 + 1
        hours = [hours[0] + timedelta(hours=n) for n in range(span)]
        ranges = _ranges(hours)
        hourly.filter(bucket_start__gte=hours[0], bucket_start__lte=hours[-1]).delete()
    else:
        hourly.filter(bucket_start__in=hours).delete()
    raw = Interaction.objects.filter(tenant_id=tenant_id).filter(_served_within(ranges))
    built = rollup_rows(tenant_id, raw, period=InteractionRollup.Period.HOUR)
    within = Q()
    for start, end in ranges:
        within |= Q(bucket_start__gte=start, bucket_start__lt=end)
    ledger = InteractionRollup.objects.filter(tenant_id=tenant_id, period=InteractionRollup.Period.PRUNED)
    pruned = list(ledger.filter(within))
    if pruned:  # what retention deleted of these hours, added back (several ledger rows a key at times)
        built = _summed(tenant_id, [*built, *pruned], period=InteractionRollup.Period.HOUR, bucket=_hour)
    InteractionRollup.objects.bulk_create(built)
    _days_rebuild(tenant_id, {hour.replace(hour=0) for hour in hours})


def rollup_rows(tenant_id: int, rows: QuerySet[Any], *, period: str, model: Any = InteractionRollup) -> list[Any]:
    """``rows`` (interactions of the tenant) counted a rollup row per hour and key, unsaved (of
    ``model``: a migration passes its own)."""
    latency = _latency_counts()
    grouped: Any = (
        rows.annotate(
            bucket=TruncHour("served_at", tzinfo=UTC),
            name=Case(When(adapter__isnull=True, then=F("model_name")), default=Value("")),
            feedback_outcome=Coalesce(F("feedback__outcome"), Value("")),
        )
        .values(
            "bucket", "adapter_id", "name", "adapter_version_id", "experiment_id", "experiment_arm", "feedback_outcome"
        )
        .annotate(
            requests=Count("id"),
            suggestions=Count("id", filter=~Q(completion="")),
            reward_weight=Coalesce(Sum("feedback__reward_weight"), Value(0.0), output_field=FloatField()),
            latency_count=Count("latency_ms"),
            latency_sum_ms=Coalesce(Sum("latency_ms"), Value(0.0), output_field=FloatField()),
            **latency,
        )
        .order_by()
    )
    return [
        model(
            tenant_id=tenant_id,
            period=period,
            bucket_start=row["bucket"],
            adapter_id=row["adapter_id"],
            model_name=row["name"] or "",
            adapter_version_id=row["adapter_version_id"],
            experiment_id=row["experiment_id"],
            experiment_arm=row["experiment_arm"],
            outcome=row["feedback_outcome"],
            requests=row["requests"],
            suggestions=row["suggestions"],
            reward_weight=row["reward_weight"],
            latency_count=row["latency_count"],
            latency_sum_ms=row["latency_sum_ms"],
            latency_buckets=[row[name] for name in latency],
        )
        for row in grouped
    ]


def _summed(
    tenant_id: int, rows: Iterable[InteractionRollup], *, period: str, bucket: Callable[[datetime], datetime]
) -> list[InteractionRollup]:
    """``rows`` added up into new rows of ``period``, one per ``bucket`` of their start and key."""
    totals: dict[tuple, InteractionRollup] = {}
    for row in rows:
        key = (bucket(row.bucket_start), *(getattr(row, name) for name in KEY_FIELDS))
        total = totals.get(key)
        if total is None:
            total = totals[key] = InteractionRollup(
                tenant_id=tenant_id,
                period=period,
                bucket_start=key[0],
                latency_buckets=[0] * (len(LATENCY_BOUNDS_MS) + 1),
                **{name: getattr(row, name) for name in KEY_FIELDS},
            )
        for name in _SUMS:
            setattr(total, name, getattr(total, name) + getattr(row, name))
        total.latency_buckets = [a + b for a, b in zip(total.latency_buckets, row.latency_buckets, strict=False)]
    return list(totals.values())


def _days_rebuild(tenant_id: int, days: Iterable[datetime]) -> None:
    """A day's rollups are the sum of its hours' (the hours stay; a day outlives none of them)."""
    days = sorted(days)
    InteractionRollup.objects.filter(
        tenant_id=tenant_id, period=InteractionRollup.Period.DAY, bucket_start__in=days
    ).delete()
    wanted = set(days)
    hourly = InteractionRollup.objects.filter(
        tenant_id=tenant_id,
        period=InteractionRollup.Period.HOUR,
        bucket_start__gte=days[0],
        bucket_start__lt=days[-1] + timedelta(days=1),
    )
    rows = (row for row in hourly if _day(row.bucket_start) in wanted)
    InteractionRollup.objects.bulk_create(_summed(tenant_id, rows, period=InteractionRollup.Period.DAY, bucket=_day))
