"""Reads of end users, and the one consent rule.

The rule (one place, used by training eligibility and by randomisation): an event trains only if
its end user was opted in when it happened (``Interaction.end_user_opted_in``, recorded then)
*and* is still opted in now (``EndUser.opted_in``). Opting out withdraws consent for every later
run; opting back in does not resurrect events that happened while opted out.
"""

from __future__ import annotations

from typing import Any

from django.db.models import Count, Exists, OuterRef, Q, QuerySet

from apps.cohorts.models import ConsentChange, EndUser
from apps.common.exceptions import NotFound
from apps.common.lookups import in_values
from apps.tenants.models import ApiKey, Tenant


def consent_default(tenant: Tenant, *, api_key: ApiKey | None = None) -> bool:
    """Consent of an end user seen for the first time with no flag: the key's default, else the tenant's."""
    if api_key is not None and api_key.default_opt_in is not None:
        return api_key.default_opt_in
    return tenant.default_opt_in


def consented_events(prefix: str = "interaction__") -> Q:
    """The consent rule as a filter on rows that reach an Interaction through ``prefix``
    ("" for Interaction itself, "interaction__" for Feedback)."""
    still_opted_in = EndUser.objects.filter(
        tenant_id=OuterRef(f"{prefix}tenant_id"), external_id=OuterRef(f"{prefix}end_user_id"), opted_in=True
    )
    return Q(**{f"{prefix}end_user_opted_in": True}) & Q(Exists(still_opted_in))


def end_user_get_for_tenant(tenant: Tenant, *, external_id: str) -> EndUser:
    user = EndUser.objects.filter(tenant=tenant, external_id=external_id).first()
    if user is None:
        raise NotFound(f"no end user {external_id[:200]!r}")
    return user


def end_user_list(tenant: Tenant, *, search: str | None = None, opted_in: bool | None = None) -> QuerySet[EndUser]:
    users = EndUser.objects.filter(tenant=tenant)
    if search:
        users = users.filter(external_id__icontains=search)
    if opted_in is not None:
        users = users.filter(opted_in=opted_in)
    return users.order_by("external_id")


def end_user_counts(tenant: Tenant) -> dict[str, int]:
    counts = EndUser.objects.filter(tenant=tenant).aggregate(
        total=Count("id"), opted_in=Count("id", filter=Q(opted_in=True))
    )
    return {"total": counts["total"], "opted_in": counts["opted_in"], "opted_out": counts["total"] - counts["opted_in"]}


def consent_history(end_user: EndUser) -> QuerySet[ConsentChange]:
    return end_user.consent_history.order_by("-changed_at", "-id")


def end_user_detail(tenant: Tenant, *, end_user: EndUser, recent: int = 20) -> dict[str, Any]:
    """State, history, experiment assignments and recent interactions of one end user."""
    from apps.experiments.models import ExperimentExposure
    from apps.interactions.models import Interaction

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
    from apps.training.models import TrainingRunEvent

    events = TrainingRunEvent.objects.filter(feedback__interaction__in=interactions, run__output_version__isnull=False)
    out: list[list[dict[str, Any]]] = []
    for held_out in (False, True):
        rows = (
            events.filter(held_out=held_out)
            .values("run__output_version__number", "run__output_version__vllm_name", "run__adapter__name")
            .distinct()
        )
        out.append(
            [
                {
                    "adapter": r["run__adapter__name"],
                    "version": r["run__output_version__number"],
                    "vllm_name": r["run__output_version__vllm_name"],
                }
                for r in sorted(rows, key=lambda r: (r["run__adapter__name"], r["run__output_version__number"]))
            ]
        )
    return out[0], out[1]


def end_user_erase_preview(tenant: Tenant, *, external_id: str) -> dict[str, Any]:
    """What ``end_user_erase`` would delete now, counted without deleting anything, and the versions
    that learned from the user's events (the same lineage the erase report names)."""
    from apps.experiments.models import ExperimentExposure
    from apps.interactions.models import ConversationOutcome, Feedback, Interaction
    from apps.serving.models import ServingFailure

    user = EndUser.objects.filter(tenant=tenant, external_id=external_id).first()
    interactions = Interaction.objects.filter(tenant=tenant, end_user_id=external_id)
    if user is None and not interactions.exists():
        raise NotFound(f"no end user {external_id[:200]!r}")
    client_ids = [c for c in interactions.values_list("client_id", flat=True) if c]
    trained_on, evaluated_on = versions_touched_by(interactions)
    return {
        "deleted": {
            "interactions": interactions.count(),
            "session_outcomes": ConversationOutcome.objects.filter(
                tenant=tenant, conversation_id__in=interactions.exclude(conversation_id="").values("conversation_id")
            ).count(),
            "feedback": Feedback.objects.filter(tenant=tenant, interaction__in=interactions).count(),
            "pending_feedback": Feedback.objects.filter(
                tenant=tenant, **in_values("pending_client_id", client_ids)
            ).count()
            if client_ids
            else 0,
            "serving_failures": ServingFailure.objects.filter(tenant=tenant, end_user_id=external_id).count(),
            "exposures": ExperimentExposure.objects.filter(end_user=user).count() if user else 0,
            "consent_history": ConsentChange.objects.filter(end_user=user).count() if user else 0,
            "end_users": 1 if user else 0,
        },
        "versions_trained_on": trained_on,
        "versions_evaluated_on": evaluated_on,
    }
