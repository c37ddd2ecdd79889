"""Feedback that arrived before its interaction, attached once the interaction is stored (in
the transaction that stores it, and by the sweeper for the rare race between two)."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from django.db import connection, transaction

from apps.common.lookups import in_values
from apps.common.parsing import is_uuid
from apps.interactions.models import Feedback, Interaction, PersistenceReport
from apps.interactions.services.feedback import feedback_merge, training_check_on_commit
from apps.tenants.models import Tenant

logger = logging.getLogger(__name__)


def pending_kinds(tenant: Tenant, *, client_ids: Sequence[str]) -> set[str]:
    """Which early rows wait for any of ``client_ids``: "feedback", "persistence" (reports), both or
    neither. One plain query probes both tables: the ingest hot path asks it for every batch it
    stores, and the common answer is neither."""
    if not client_ids:
        return set()
    quote = connection.ops.quote_name
    values: list[Any]
    if connection.vendor == "postgresql":
        among, values = "= ANY(%s)", [list(client_ids)]
    else:
        among, values = f"IN ({', '.join(['%s'] * len(client_ids))})", list(client_ids)
    probes = [
        f"EXISTS (SELECT 1 FROM {quote(model._meta.db_table)} WHERE tenant_id = %s "
        f"AND pending_client_id IS NOT NULL AND pending_client_id {among})"
        for model in (Feedback, PersistenceReport)
    ]
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {', '.join(probes)}", [tenant.pk, *values, tenant.pk, *values])
        feedback, reports = cursor.fetchone()
    return {kind for kind, waiting in (("feedback", feedback), ("persistence", reports)) if waiting}


def feedback_attach_pending(tenant: Tenant, *, client_ids: Sequence[str] | None = None) -> int:
    """Attach feedback that arrived before its interaction. Returns how many rows were attached.

    Called in the transaction that stores interactions, and periodically by a sweeper for the rare
    case where both arrived at the same moment in two transactions that could not see each other.
    """
    pending = Feedback.objects.filter(tenant=tenant, pending_client_id__isnull=False)
    if client_ids is not None:
        pending = pending.filter(**in_values("pending_client_id", client_ids))
    if not pending.exists():  # the common case on the ingest hot path: one indexed probe, no savepoint
        return 0
    attached = 0
    with transaction.atomic():
        waiting = list(pending.select_for_update().order_by("pk"))  # in key order, as retention locks them
        named = [f.pending_client_id for f in waiting if f.pending_client_id is not None]
        ids = dict(
            Interaction.objects.filter(tenant=tenant, **in_values("client_id", named)).values_list("client_id", "id")
        )
        ids.update(_served_ids(tenant, [name for name in named if name not in ids]))
        for feedback in waiting:
            interaction_id = ids.get(feedback.pending_client_id)
            if interaction_id is None:
                continue
            existing = Feedback.objects.select_for_update().filter(tenant=tenant, interaction_id=interaction_id).first()
            if existing is not None:
                feedback_merge(existing, feedback)
                feedback.delete()
                existing.save()
            else:
                feedback.interaction_id, feedback.pending_client_id = interaction_id, None
                feedback.save(update_fields=["interaction", "pending_client_id"])
            attached += 1
        if attached:
            training_check_on_commit(tenant.pk)
    return attached


def _served_ids(tenant: Tenant, names: list[str]) -> dict[str, uuid.UUID]:
    """Feedback on an open stream waits under the id its interaction will have
    (``apps.interactions.stream_parts``): the names among ``names`` that are such ids, recorded now."""
    candidates = [name for name in names if is_uuid(name)]
    if not candidates:
        return {}
    found = Interaction.objects.filter(
        tenant=tenant, source=Interaction.Source.SERVED, **in_values("id", [uuid.UUID(c) for c in candidates])
    ).values_list("id", flat=True)
    return {str(interaction_id): interaction_id for interaction_id in found}


def feedback_attach_pending_all() -> int:
    """The sweeper: attach pending feedback of every tenant whose interaction has arrived."""
    return pending_attach_all(Feedback, feedback_attach_pending, what="pending feedback")


def pending_attach_all(model: type[Feedback | PersistenceReport], attach: Callable[[Tenant], int], *, what: str) -> int:
    """The sweeper's pass over one kind of early row: ``attach`` for each tenant with rows of ``model``
    waiting. One tenant's failure is logged and left to the next sweep; the others go on."""
    tenant_ids = set(
        model.objects.filter(pending_client_id__isnull=False).values_list("tenant_id", flat=True).distinct()
    )
    attached = 0
    for tenant in Tenant.objects.filter(pk__in=tenant_ids).order_by("pk"):
        try:
            attached += attach(tenant)
        except Exception:
            logger.exception("attaching %s failed for tenant %s", what, tenant.pk)
    return attached
