"""Each exposed user's behaviour before their first exposure, frozen on their exposure row.

The covariates of the regression-adjusted lift (``stats.adjustment``) must not move while the
experiment runs: the always-valid argument treats them as fixed at exposure, and recomputing them
at each snapshot would let later production traffic, late feedback or retention (a window shorter
than ``HISTORY_WINDOW`` plus the run deletes the pre-period rows) change a user's covariates from
one look to the next. So the sums over the user's production traffic in the window before their
first exposure are computed once, when the exposure is recorded, and stored on the exposure row
(``history_frozen_at`` set); every snapshot reads them from there. Exposures recorded before the
columns existed (or whose freeze failed) are frozen by the next snapshot, once, the same way.

The window: production traffic (no experiment) of the tenant, served from ``HISTORY_WINDOW``
before the experiment started up to the user's first exposure.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import transaction
from django.db.models import Count, F, OuterRef, Q, Subquery, Sum
from django.utils import timezone

from apps.experiments.models import Experiment, ExperimentExposure
from apps.interactions.models import SHOWN_OUTCOMES, Feedback, Interaction
from apps.interactions.rewards import reward_expression, reward_table_for

HISTORY_WINDOW = timedelta(days=14)
_BATCH = 5000  # exposures written per statement


def history_freeze(experiment: Experiment, *, end_user_id: int | None = None) -> int:
    """Compute and store the pre-exposure sums of the experiment's exposures that have none yet
    (only ``end_user_id``'s, when given): one grouped query. Returns the rows frozen."""
    pending = ExperimentExposure.objects.filter(experiment=experiment, history_frozen_at__isnull=True)
    if end_user_id is not None:
        pending = pending.filter(end_user_id=end_user_id)
    exposures = {e.end_user.external_id: e for e in pending.select_related("end_user")}
    if not exposures:
        return 0
    since = (experiment.started_at or experiment.created_at) - HISTORY_WINDOW
    reward = reward_expression(reward_table_for(experiment.adapter))
    rows = Interaction.objects.filter(
        tenant_id=experiment.tenant_id,
        experiment__isnull=True,
        served_at__gte=since,
        end_user_id__in=list(exposures),
    )
    if len(exposures) == 1:  # the serving path: one user, whose exposure time is known
        (exposure,) = exposures.values()
        rows = rows.filter(served_at__lt=exposure.first_exposed_at)
    else:  # each user's own exposure time, found through the (tenant, external_id) index
        exposed_at = ExperimentExposure.objects.filter(
            experiment=experiment,
            end_user__tenant_id=experiment.tenant_id,
            end_user__external_id=OuterRef("end_user_id"),
        ).values("first_exposed_at")[:1]
        rows = rows.annotate(exposed_at=Subquery(exposed_at)).filter(served_at__lt=F("exposed_at"))
    per_user = rows.values("end_user_id").annotate(
        requests=Count("id"),
        shown=Count("id", filter=~Q(completion="") & Q(feedback__outcome__in=SHOWN_OUTCOMES)),
        accepted=Count("id", filter=~Q(completion="") & Q(feedback__outcome=Feedback.Outcome.ACCEPTED)),
        reward=Sum(reward),  # type: ignore[arg-type]
    )
    now = timezone.now()
    sums = {row["end_user_id"]: row for row in per_user}
    frozen = 0
    # Only rows still unfrozen are written: a concurrent freeze of the same user got there first.
    # Users without history (often most): one UPDATE per batch.
    without = [e.pk for user, e in exposures.items() if user not in sums]
    for start in range(0, len(without), _BATCH):
        frozen += ExperimentExposure.objects.filter(
            pk__in=without[start : start + _BATCH], history_frozen_at__isnull=True
        ).update(history_requests=0, history_shown=0, history_accepted=0, history_reward=0.0, history_frozen_at=now)
    with_history = [e for user, e in exposures.items() if user in sums]
    for start in range(0, len(with_history), _BATCH):
        batch = with_history[start : start + _BATCH]
        with transaction.atomic():
            # The rows still unfrozen, locked: a concurrent freeze (the serving path, a snapshot)
            # skips them and, once this commits, finds them frozen; none is written twice.
            still = set(
                ExperimentExposure.objects.filter(pk__in=[e.pk for e in batch], history_frozen_at__isnull=True)
                .select_for_update(skip_locked=True)
                .values_list("pk", flat=True)
            )
            for exposure in batch:
                row = sums[exposure.end_user.external_id]
                exposure.history_requests, exposure.history_shown = row["requests"], row["shown"]
                exposure.history_accepted, exposure.history_reward = row["accepted"], float(row["reward"] or 0.0)
                exposure.history_frozen_at = now
            frozen += ExperimentExposure.objects.bulk_update(
                [e for e in batch if e.pk in still],
                ["history_requests", "history_shown", "history_accepted", "history_reward", "history_frozen_at"],
                batch_size=1000,
            )
    return frozen
