from __future__ import annotations

import uuid
from typing import Any

from django.db.models import Count, QuerySet

from apps.common.exceptions import NotFound
from apps.common.parsing import is_uuid
from apps.interactions.models import Feedback, Interaction, PersistenceReport, StreamPart
from apps.interactions.served import SERVED_BY_KEY
from apps.tenants.models import Tenant


def interaction_get_for_tenant(tenant: Tenant, *, interaction_id: str | uuid.UUID) -> Interaction:
    if not isinstance(interaction_id, uuid.UUID) and not is_uuid(interaction_id):
        raise NotFound(f"interaction {str(interaction_id)[:64]!r} not found")
    try:
        return Interaction.objects.get(tenant=tenant, pk=uuid.UUID(str(interaction_id)))
    except Interaction.DoesNotExist:
        raise NotFound(f"interaction {interaction_id} not found") from None


def stream_open_ids(tenant: Tenant, *, ids: set[uuid.UUID], served_by_key: str | None = None) -> set[uuid.UUID]:
    """Which of ``ids`` are open streams' interactions (``apps.interactions.stream_parts``): served
    through the key whose prefix is ``served_by_key``, if given. No query for no ids."""
    if not ids:
        return set()
    first = StreamPart.objects.filter(tenant=tenant, seq=0, interaction_id__in=ids)
    if served_by_key is not None:
        first = first.filter(**{f"metadata__{SERVED_BY_KEY}": served_by_key})
    return set(first.values_list("interaction_id", flat=True))


def stream_open_ids_of_user(tenant: Tenant, *, end_user_id: str) -> list[str]:
    """The ids of the open streams served to an end user (feedback on them waits under these)."""
    first = StreamPart.objects.filter(tenant=tenant, seq=0, head__end_user_id=end_user_id)
    return [str(i) for i in first.values_list("interaction_id", flat=True)]


def interaction_get_by_client_id(tenant: Tenant, *, client_id: str) -> Interaction:
    try:
        return Interaction.objects.get(tenant=tenant, client_id=client_id)
    except Interaction.DoesNotExist:
        raise NotFound(f"no interaction with client_id {client_id!r}") from None


def interaction_list(tenant: Tenant, *, end_user_id: str | None = None) -> QuerySet[Interaction]:
    qs = Interaction.objects.filter(tenant=tenant).order_by("-received_at", "-id")
    if end_user_id:
        qs = qs.filter(end_user_id=end_user_id)
    return qs


def conversation_turns(tenant: Tenant, *, conversation_id: str) -> list[dict[str, Any]]:
    """The turns of one agent session, in order, with their feedback's outcome (several choices
    of one turn share its number)."""
    turns: Any = (
        Interaction.objects.filter(tenant=tenant, conversation_id=conversation_id)
        .order_by("turn", "served_at", "id")
        .values("id", "turn", "served_at", "feedback__outcome", "feedback__session_outcome_id")[:200]
    )
    return list(turns)


def feedback_for_interaction(tenant: Tenant, *, interaction: Interaction) -> Feedback | None:
    return Feedback.objects.filter(tenant=tenant, interaction=interaction).first()


def feedback_pending_list(tenant: Tenant) -> QuerySet[Feedback]:
    return Feedback.objects.filter(tenant=tenant, pending_client_id__isnull=False).order_by("received_at")


def feedback_pending_counts() -> dict[str, int]:
    """Feedback still waiting for its interaction, per tenant slug, across tenants (for operators)."""
    rows = (
        Feedback.objects.filter(pending_client_id__isnull=False)
        .values_list("tenant__slug")
        .annotate(count=Count("id"))
        .order_by()
    )
    return dict(rows)


def persistence_for_interaction(tenant: Tenant, *, interaction: Interaction) -> list[PersistenceReport]:
    """The interaction's measured persistence reports (pending ones name no interaction yet), by
    checkpoint: what was left of the accepted text at each time after the accept."""
    return list(
        PersistenceReport.objects.filter(tenant=tenant, interaction=interaction, retained_chars__isnull=False).order_by(
            "checkpoint_s"
        )
    )
