"""Per-user sums of each arm, aggregated in the database, for the statistics.

Every exposed user is one row of their arm, also without a request yet. A request is a served
interaction of the experiment or a serving failure of it; a suggestion is *shown* when its
completion is not empty and the user's feedback says they saw it (accepted, rejected or
edited); *accepted* counts accepted ones; the reward is the adapter's reward policy applied to
the feedback (``apps.interactions.rewards``: no feedback yet is 0, as silence); *slow* requests
are those above the control arm's pooled p95 latency.

Each user also carries their behaviour before their first exposure: the same sums over the
tenant's production traffic (no experiment; logged interactions name no adapter, and any
behaviour before exposure is a valid covariate), frozen on the exposure row when the user was
exposed (``apps.experiments.history``), turned into the covariates of the regression-adjusted
lift (``stats.adjustment``).
"""

from __future__ import annotations

import numpy as np
from django.db import connection
from django.db.models import Count, Q, QuerySet, Sum, Value

from apps.experiments.history import arms_with_history
from apps.experiments.models import CANDIDATE, CONTROL, Experiment
from apps.experiments.retained import retained_per_user
from apps.experiments.stats import ArmData
from apps.experiments.stats.metrics import USER_COLUMNS
from apps.interactions.models import SHOWN_OUTCOMES, Feedback, Interaction, ServingFailure
from apps.interactions.rewards import reward_expression, reward_table_for

# What counts as a good answer for the agents' metrics (positive_rate, positive_session_rate).
POSITIVE_OUTCOMES = (Feedback.Outcome.ACCEPTED, Feedback.Outcome.THUMBS_UP, Feedback.Outcome.EDIT_PERSISTED)


def _p95(latencies: QuerySet[Interaction], experiment: Experiment, arm: str) -> float | None:
    rows = latencies.filter(experiment_arm=arm, latency_ms__isnull=False)
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT percentile_cont(0.95) WITHIN GROUP (ORDER BY latency_ms) FROM "
                f"{connection.ops.quote_name(Interaction._meta.db_table)} WHERE experiment_id = %s "
                f"AND experiment_arm = %s AND latency_ms IS NOT NULL",
                [experiment.pk, arm],
            )
            value = cursor.fetchone()[0]
        return float(value) if value is not None else None
    values = np.array(list(rows.values_list("latency_ms", flat=True)), dtype=np.float64)
    return float(np.percentile(values, 95)) if values.size else None


def experiment_arm_data(experiment: Experiment) -> tuple[ArmData, ArmData]:
    """(control, candidate) per-user sums, in a handful of grouped queries whatever the traffic."""
    interactions = Interaction.objects.filter(experiment=experiment)
    threshold = _p95(interactions, experiment, CONTROL)
    reward = reward_expression(reward_table_for(experiment.adapter))
    per_user = interactions.values("experiment_arm", "end_user_id").annotate(
        requests=Count("id"),
        shown=Count("id", filter=~Q(completion="") & Q(feedback__outcome__in=SHOWN_OUTCOMES)),
        accepted=Count("id", filter=~Q(completion="") & Q(feedback__outcome=Feedback.Outcome.ACCEPTED)),
        reward=Sum(reward),
        slow=Count("id", filter=Q(latency_ms__gt=threshold)) if threshold is not None else Value(0),
        positive=Count("id", filter=Q(feedback__outcome__in=POSITIVE_OUTCOMES)),
        dissatisfied=Count("id", filter=Q(feedback__outcome=Feedback.Outcome.FOLLOW_UP_DISSATISFIED)),
        sessions=Count("conversation_id", distinct=True, filter=~Q(conversation_id="")),
        positive_sessions=Count(
            "conversation_id", distinct=True, filter=~Q(conversation_id="") & Q(feedback__outcome__in=POSITIVE_OUTCOMES)
        ),
    )
    failures = (
        ServingFailure.objects.filter(experiment=experiment)
        .values("experiment_arm", "end_user_id")
        .annotate(errors=Count("id"), slow=Count("id", filter=Q(latency_ms__gt=threshold)) if threshold else Value(0))
    )
    arms, history = arms_with_history(experiment)
    columns = USER_COLUMNS
    sums = {arm: {c: np.zeros(len(users)) for c in columns} for arm, users in arms.items()}
    for row in per_user:
        index = arms.get(row["experiment_arm"], {}).get(row["end_user_id"])
        if index is None:
            continue  # served before an exposure row existed (cannot happen) or after an erase
        target = sums[row["experiment_arm"]]
        target["requests"][index] += row["requests"]
        target["shown"][index] += row["shown"]
        target["accepted"][index] += row["accepted"]
        target["reward_sum"][index] += row["reward"] or 0.0
        target["slow_requests"][index] += row["slow"]
        for column in ("positive", "dissatisfied", "sessions", "positive_sessions"):
            target[column][index] += row[column]
    for row in failures:
        index = arms.get(row["experiment_arm"], {}).get(row["end_user_id"])
        if index is None:
            continue
        target = sums[row["experiment_arm"]]
        target["requests"][index] += row["errors"]
        target["errors"][index] += row["errors"]
        target["slow_requests"][index] += row["slow"]
    for arm, user, accepted_chars, retained_chars in retained_per_user(experiment):
        index = arms.get(arm, {}).get(user)
        if index is not None:
            sums[arm]["accepted_chars"][index] += accepted_chars
            sums[arm]["retained_chars"][index] += retained_chars
    control = ArmData(**sums[CONTROL], latency_p95_ms=threshold, covariates=history[CONTROL])
    candidate = ArmData(
        **sums[CANDIDATE], latency_p95_ms=_p95(interactions, experiment, CANDIDATE), covariates=history[CANDIDATE]
    )
    return control, candidate
