"""Exposures: the first time an opted-in user met a running experiment, and in which arm."""

from __future__ import annotations

import logging

from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.cohorts.models import EndUser
from apps.experiments.history import history_freeze
from apps.experiments.models import Experiment, ExperimentExposure

logger = logging.getLogger(__name__)
# Per process: the (experiment, end user row) pairs whose exposure is recorded and committed, so a
# returning user costs no query. By the end user's row, not their external id: a user erased and
# seen again is a new row, exposed anew. Remembered only once the transaction commits: a recorded
# exposure rolled back is not one.
_exposed: dict[tuple[int, int], None] = {}
_EXPOSED_MAX = 200_000


def exposure_record(experiment: Experiment, *, external_id: str, arm: str, end_user_id: int | None = None) -> None:
    """Record that an opted-in user met the experiment, once per user (idempotent, race-safe), with
    their pre-exposure behaviour frozen beside it (``apps.experiments.history``). ``end_user_id``:
    the user's row as the caller read it (serving reads it with the API key), else looked up here."""
    if end_user_id is None:
        end_user_id = (
            EndUser.objects.filter(tenant_id=experiment.tenant_id, external_id=external_id)
            .values_list("pk", flat=True)
            .first()
        )
        if end_user_id is None:
            return
    key = (experiment.pk, end_user_id)
    if key in _exposed:
        return
    exposure = ExperimentExposure(
        tenant_id=experiment.tenant_id,
        experiment=experiment,
        end_user_id=end_user_id,
        arm=arm,
        first_exposed_at=timezone.now(),
    )
    try:
        # Serving runs in autocommit, so the user's foreign key is checked as this block commits: an
        # erase since the request read the user is a user not exposed, not a failed completion. (Inside
        # a caller's transaction the check waits for that transaction's commit.)
        with transaction.atomic():
            ExperimentExposure.objects.bulk_create([exposure], ignore_conflicts=True)
    except IntegrityError:
        logger.info("experiment %s: not exposed, the end user (or the experiment) is gone", experiment.pk)
        return
    try:
        with transaction.atomic():  # a failure here must not fail the completion or its transaction
            history_freeze(experiment, end_user_id=end_user_id)  # nothing to do when the row was there, frozen
    except Exception:  # noqa: BLE001 - the next snapshot freezes it (apps.experiments.history)
        logger.exception("experiment %s: freezing a user's history at exposure failed", experiment.pk)
    transaction.on_commit(lambda: _remember(key))


def _remember(key: tuple[int, int]) -> None:
    if len(_exposed) >= _EXPOSED_MAX:
        _exposed.clear()
    _exposed[key] = None
