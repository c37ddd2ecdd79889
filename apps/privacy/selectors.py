"""Everything Strop holds about one end user, read across the apps that hold it: their consent
(cohorts), interactions, feedback and serving failures (interactions), experiment exposures
(experiments) and the training runs and versions that used their events (training)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db.models import Exists, OuterRef, QuerySet

from apps.cohorts.models import ConsentChange, EndUser
from apps.cohorts.selectors import consent_history
from apps.common.exceptions import NotFound
from apps.common.lookups import in_values
from apps.experiments.models import ExperimentExposure
from apps.interactions.models import ConversationOutcome, Feedback, Interaction, PersistenceReport, ServingFailure
from apps.interactions.selectors import stream_open_ids_of_user
from apps.tenants.models import Tenant
from apps.training.models import TrainingRunEvent


def end_user_detail(tenant: Tenant, *, end_user: EndUser, recent: int = 20) -> dict[str, Any]:
    """State, history, experiment assignments and recent interactions of one end user."""
    exposures = ExperimentExposure.objects.filter(tenant=tenant, end_user=end_user).select_related(
        "experiment__adapter"
    )
    interactions = Interaction.objects.filter(tenant=tenant, end_user_id=end_user.external_id).order_by(
        "-received_at", "-id"
    )
    return {
        "history": list(consent_history(end_user)[:100]),
        "exposures": list(exposures.order_by("-first_exposed_at")),
        "recent_interactions": list(interactions.prefetch_related("feedback")[:recent]),
        "interactions": interactions.count(),
    }


def versions_touched_by(interactions: QuerySet[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The adapter versions whose runs trained on, and were evaluated on (held out), these
    interactions' events: (trained_on, evaluated_on), each sorted by adapter and number."""
    events = TrainingRunEvent.objects.filter(feedback__interaction__in=interactions, run__output_version__isnull=False)
    rows = events.values(
        "held_out", "run__output_version__number", "run__output_version__vllm_name", "run__adapter__name"
    ).distinct()  # one pass over their events for both lists
    out: list[list[dict[str, Any]]] = [[], []]
    for r in sorted(rows, key=lambda r: (r["run__adapter__name"], r["run__output_version__number"])):
        out[r["held_out"]].append(
            {"adapter": r["run__adapter__name"], "version": r["run__output_version__number"],
             "vllm_name": r["run__output_version__vllm_name"]}
        )  # fmt: skip
    return out[0], out[1]


def pending_keys(
    client_ids: Iterable[str | None], *, failures: QuerySet[ServingFailure], open_streams: list[str]
) -> list[str]:
    """The ids an end user's labels may wait under as pending: their interactions' client ids, their
    open streams' ids, and the ids of the streams vLLM failed for them (kept on the failure)."""
    failed_streams = [i for ids in failures.values_list("stream_ids", flat=True) for i in ids or ()]
    return [c for c in client_ids if c] + open_streams + failed_streams


def end_user_erase_preview(tenant: Tenant, *, external_id: str) -> dict[str, Any]:
    """What ``end_user_erase`` would delete now, counted without deleting anything, and the versions
    that learned from the user's events (the same lineage the erase report names)."""
    user = EndUser.objects.filter(tenant=tenant, external_id=external_id).first()
    interactions = Interaction.objects.filter(tenant=tenant, end_user_id=external_id)
    failures = ServingFailure.objects.filter(tenant=tenant, end_user_id=external_id)
    open_streams = stream_open_ids_of_user(tenant, end_user_id=external_id)  # feedback waits under these too
    if user is None and not open_streams and not interactions.exists() and not failures.exists():
        raise NotFound(f"no end user {external_id[:200]!r}")
    client_ids = pending_keys(
        interactions.values_list("client_id", flat=True), failures=failures, open_streams=open_streams
    )
    trained_on, evaluated_on = versions_touched_by(interactions)
    # Another user's turns in one of the sessions (by the partial index on sessions' turns, which
    # the non-empty test lets the planner use).
    others_turns = (
        Interaction.objects.filter(tenant=tenant, conversation_id=OuterRef("conversation_id"), turn__isnull=False)
        .exclude(conversation_id="")
        .exclude(end_user_id=external_id)
    )
    return {
        "deleted": {
            "interactions": interactions.count(),
            "session_outcomes": ConversationOutcome.objects.filter(
                tenant=tenant, conversation_id__in=interactions.exclude(conversation_id="").values("conversation_id")
            )
            .exclude(Exists(others_turns))  # another user's turns share the session: its outcome stays
            .count(),
            "feedback": Feedback.objects.filter(tenant=tenant, interaction__in=interactions).count(),
            "pending_feedback": Feedback.objects.filter(
                tenant=tenant, **in_values("pending_client_id", client_ids)
            ).count()
            if client_ids
            else 0,
            "persistence_reports": PersistenceReport.objects.filter(
                tenant=tenant, interaction__in=interactions
            ).count(),
            "pending_persistence_reports": PersistenceReport.objects.filter(
                tenant=tenant, **in_values("pending_client_id", client_ids)
            ).count()
            if client_ids
            else 0,
            "serving_failures": failures.count(),
            "exposures": ExperimentExposure.objects.filter(end_user=user).count() if user else 0,
            "consent_history": ConsentChange.objects.filter(end_user=user).count() if user else 0,
            "end_users": 1 if user else 0,
        },
        "versions_trained_on": trained_on,
        "versions_evaluated_on": evaluated_on,
    }
