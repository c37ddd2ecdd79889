"""Exposures: the first time an opted-in user met a running experiment, and in which arm."""

from __future__ import annotations

from django.utils import timezone

from apps.cohorts.models import EndUser
from apps.experiments.history import history_freeze
from apps.experiments.models import Experiment, ExperimentExposure

_exposed: dict[tuple[int, str], None] = {}  # per process: exposures already recorded (bounded below)
_EXPOSED_MAX = 200_000


def exposure_record(experiment: Experiment, *, external_id: str, arm: str) -> None:
    """Record that an opted-in user met the experiment, once per user (idempotent, race-safe), with
    their pre-exposure behaviour frozen beside it (``apps.experiments.history``)."""
    key = (experiment.pk, external_id)
    if key in _exposed:
        return
    user_id = (
        EndUser.objects.filter(tenant_id=experiment.tenant_id, external_id=external_id)
        .values_list("pk", flat=True)
        .first()
    )
    if user_id is None:
        return
    ExperimentExposure.objects.bulk_create(
        [
            ExperimentExposure(
                tenant_id=experiment.tenant_id,
                experiment=experiment,
                end_user_id=user_id,
                arm=arm,
                first_exposed_at=timezone.now(),
            )
        ],
        ignore_conflicts=True,
    )
    history_freeze(experiment, end_user_id=user_id)  # nothing to do when the row was there, frozen
    if len(_exposed) >= _EXPOSED_MAX:
        _exposed.clear()
    _exposed[key] = None
