"""Rollups' ledger of deleted rows (``pruned``): retention now adds what it deletes to it, and an hour
is recomputed as its raw rows plus its ledger, before the retention cutoff too.

Hours whose rows were deleted before this (by a retention pass, or by hand) have rollups that count
more than their raw rows: their ledger is that difference, key by key, so recomputing them keeps
what they charted. Only such hours are read: the tenant's hourly counts first (one grouped read of
its interactions), then the keys of the hours that fall short."""

from datetime import UTC, timedelta

from django.db import migrations, models
from django.db.models import Count, Sum
from django.db.models.functions import TruncHour

_SUMS = ("requests", "suggestions", "reward_weight", "latency_count", "latency_sum_ms")
_KEY = ("adapter_id", "model_name", "adapter_version_id", "experiment_id", "experiment_arm", "outcome")
_HOURS_A_READ = 24 * 7


def _by_key(rows):
    totals = {}
    for row in rows:
        key = (row.bucket_start.astimezone(UTC), *(getattr(row, name) for name in _KEY))
        total = totals.setdefault(key, {name: 0 for name in _SUMS} | {"latency_buckets": None})
        for name in _SUMS:
            total[name] += getattr(row, name)
        buckets = row.latency_buckets or []
        total["latency_buckets"] = [a + b for a, b in zip(total["latency_buckets"] or [0] * len(buckets), buckets)]
    return totals


def _ledger(kept, raw):
    """``kept`` less ``raw``, key by key: what the deleted rows counted (never below zero)."""
    for key, counts in kept.items():
        gone = raw.get(key, {})
        left = {name: counts[name] - gone.get(name, 0) for name in _SUMS}
        if left["requests"] <= 0:
            continue
        for name in ("suggestions", "latency_count"):
            left[name] = max(left[name], 0)
        buckets = counts["latency_buckets"] or []
        minus = gone.get("latency_buckets") or [0] * len(buckets)
        left["latency_buckets"] = [max(a - b, 0) for a, b in zip(buckets, minus)]
        yield key, left


def ledger_of_deleted_rows(apps, schema_editor):
    from apps.interactions import rollups

    Rollup = apps.get_model("interactions", "InteractionRollup")
    Interaction = apps.get_model("interactions", "Interaction")
    for tenant_id in Rollup.objects.filter(period="hour").values_list("tenant_id", flat=True).distinct():
        hourly = Rollup.objects.filter(tenant_id=tenant_id, period="hour")
        rolled = {h.astimezone(UTC): n for h, n in hourly.values_list("bucket_start").annotate(n=Sum("requests"))}
        raw_rows = Interaction.objects.filter(tenant_id=tenant_id)
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
