"""Existing interactions name end users only by id: make each one an EndUser.

A user's consent becomes the flag of their most recent interaction (what the request said last),
recorded in the history with source "migration".
"""

from django.db import migrations
from django.db.models import OuterRef, Subquery
from django.utils import timezone


def forwards(apps, schema_editor):
    Interaction = apps.get_model("interactions", "Interaction")
    EndUser = apps.get_model("cohorts", "EndUser")
    ConsentChange = apps.get_model("cohorts", "ConsentChange")
    latest = Interaction.objects.filter(
        tenant_id=OuterRef("tenant_id"), end_user_id=OuterRef("end_user_id")
    ).order_by("-received_at", "-id")
    rows = (
        Interaction.objects.exclude(end_user_id="")
        .values("tenant_id", "end_user_id")
        .distinct()
        .annotate(opted_in=Subquery(latest.values("end_user_opted_in")[:1]))
    )
    now = timezone.now()
    for row in rows.iterator():
        user = EndUser.objects.create(
            tenant_id=row["tenant_id"],
            external_id=row["end_user_id"],
            opted_in=bool(row["opted_in"]),
            opted_in_changed_at=now if row["opted_in"] else None,
        )
        if user.opted_in:
            ConsentChange.objects.create(
                tenant_id=row["tenant_id"], end_user=user, opted_in=True, source="migration", actor="system",
                changed_at=now,
            )


class Migration(migrations.Migration):
    dependencies = [("cohorts", "0001_initial"), ("interactions", "0004_interaction_experiment")]

    operations = [migrations.RunPython(forwards, migrations.RunPython.noop)]
