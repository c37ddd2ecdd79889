"""Rollups' ledger of deleted rows (``pruned``): retention now adds what it deletes to it, and an hour
is recomputed as its raw rows plus its ledger, before the retention cutoff too.

Hours before a tenant's retention cutoff whose rows a pass deleted before this have rollups that
count more than their raw rows: their ledger is that difference (``_ledger``), so recomputing them
keeps what they charted. Only such hours are read: the tenant's hourly counts before its cutoff
first (one grouped read of its interactions), then the keys of the hours that fall short."""

from datetime import UTC, timedelta

from django.db import migrations, models
from django.db.models import Count, Sum
from django.db.models.functions import TruncHour
from django.utils import timezone

_SUMS = ("requests", "suggestions", "reward_weight", "latency_count", "latency_sum_ms")
_KEY = ("adapter_id", "model_name", "adapter_version_id", "experiment_id", "experiment_arm", "outcome")
_HOURS_A_READ = 24 * 7
_BUCKETS = 8  # LATENCY_BOUNDS_MS' seven bounds, then above them


def _by_key(rows):
    """Each key's counts as one vector: the sums, then the latency buckets."""
    totals = {}
    for row in rows:
        key = (row.bucket_start.astimezone(UTC), *(getattr(row, name) for name in _KEY))
        counts = [getattr(row, name) for name in _SUMS] + list(row.latency_buckets or [0] * _BUCKETS)
        total = totals.get(key)
        totals[key] = counts if total is None else [a + b for a, b in zip(total, counts, strict=True)]
    return totals


def _ledger(kept, raw):
    """What the deleted rows counted: ``kept`` (the hour's rollups) less ``raw`` (its rows now). Per
    key but its outcome the ledger is exactly that difference; how it splits between outcomes is each
    outcome's own difference where positive, trimmed (the no-feedback outcome first) where the hour's
    rollups were stale: a kept row labelled late moved from "" to its outcome in the raw rows, never
    in rollups of hours that were not recomputed."""
    width = len(_SUMS) + _BUCKETS
    groups, raw_totals = {}, {}
    for key in kept:
        groups.setdefault(key[:-1], []).append(key)
    for key, counts in raw.items():
        total = raw_totals.get(key[:-1], [0] * width)
        raw_totals[key[:-1]] = [a + b for a, b in zip(total, counts, strict=True)]
    for group, keys in groups.items():
        keys.sort(key=lambda key: (key[-1] != "", key[-1]))  # "" trimmed first
        zero = [0] * width
        gone = {key: [max(a - b, 0) for a, b in zip(kept[key], raw.get(key, zero), strict=True)] for key in keys}
        for i in range(width):
            deficit = sum(kept[key][i] for key in keys) - raw_totals.get(group, zero)[i]
            excess = sum(gone[key][i] for key in keys) - max(deficit, 0)
            for key in keys:
                cut = min(gone[key][i], excess)
                gone[key][i], excess = gone[key][i] - cut, excess - cut
        for key in keys:
            if gone[key][0] > 0:  # requests
                yield key, {**dict(zip(_SUMS, gone[key], strict=False)), "latency_buckets": gone[key][len(_SUMS) :]}


def ledger_of_deleted_rows(apps, schema_editor):
    from apps.interactions import rollups

    Rollup = apps.get_model("interactions", "InteractionRollup")
    Interaction = apps.get_model("interactions", "Interaction")
    Tenant = apps.get_model("tenants", "Tenant")
    now = timezone.now()
    for tenant_id, days in Tenant.objects.values_list("pk", "retention_days"):
        # Only hours before the cutoff were ever left stale or pruned: later ones were recomputed from
        # their rows at each mark (one pending now is beat's to take, as before).
        days = rollups.retention_days_effective(days)
        if not days:
            continue
        cutoff = (now - timedelta(days=days)).astimezone(UTC).replace(minute=0, second=0, microsecond=0)
        hourly = Rollup.objects.filter(tenant_id=tenant_id, period="hour", bucket_start__lt=cutoff)
        rolled = {h.astimezone(UTC): n for h, n in hourly.values_list("bucket_start").annotate(n=Sum("requests"))}
        raw_rows = Interaction.objects.filter(tenant_id=tenant_id, served_at__lt=cutoff)
        counted = raw_rows.annotate(hour=TruncHour("served_at", tzinfo=UTC)).values_list("hour").annotate(n=Count("id"))
        raw_counts = {hour.astimezone(UTC): n for hour, n in counted}
        short = sorted(hour for hour, n in rolled.items() if n > raw_counts.get(hour, 0))
        for start in range(0, len(short), _HOURS_A_READ):
            hours = short[start : start + _HOURS_A_READ]
            kept = _by_key(hourly.filter(bucket_start__in=hours))
            within = models.Q()
            for hour in hours:
                within |= models.Q(served_at__gte=hour, served_at__lt=hour + timedelta(hours=1))
            raw = _by_key(rollups.rollup_rows(tenant_id, raw_rows.filter(within), model=Rollup, period="hour"))
            Rollup.objects.bulk_create(
                Rollup(
                    tenant_id=tenant_id,
                    period="pruned",
                    bucket_start=key[0],
                    **dict(zip(_KEY, key[1:], strict=True)),
                    **left,
                )
                for key, left in _ledger(kept, raw)
            )


class Migration(migrations.Migration):
    dependencies = [
        ("interactions", "0019_interaction_ids_by_time"),
    ]

    operations = [
        migrations.AlterField(
            model_name="interactionrollup",
            name="period",
            field=models.CharField(choices=[("hour", "Hour"), ("day", "Day"), ("pruned", "Pruned")], max_length=8),
        ),
        migrations.RunPython(ledger_of_deleted_rows, migrations.RunPython.noop),
    ]
