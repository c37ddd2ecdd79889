"""Retained characters per user of an experiment's arms, from persistence reports.

Each interaction counts once, at the latest checkpoint a client reported for it (a report at
10 minutes says more about what was kept than one at 30 seconds): its accepted characters and, of
them, the characters still there. Interactions without a report add nothing, so a tenant whose
editors send no reports sees zeros (the metrics then have no data, not a lift)."""

from __future__ import annotations

from django.db.models import F, OuterRef, QuerySet, Subquery, Sum

from apps.experiments.models import Experiment
from apps.interactions.models import PersistenceReport


def retained_per_user(experiment: Experiment) -> QuerySet:
    """One grouped query: per arm (``part_arm``) and end user (``part_user``) with reports, the
    characters ``accepted`` and ``retained``."""
    latest = (
        PersistenceReport.objects.filter(interaction=OuterRef("interaction"))
        .order_by("-checkpoint_s")
        .values("checkpoint_s")[:1]
    )
    return (
        PersistenceReport.objects.filter(
            interaction__experiment=experiment, retained_chars__isnull=False, checkpoint_s=Subquery(latest)
        )
        .values(part_arm=F("interaction__experiment_arm"), part_user=F("interaction__end_user_id"))
        .annotate(accepted=Sum("accepted_chars"), retained=Sum("retained_chars"))
        .order_by()
    )
