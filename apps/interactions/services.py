"""Ingestion of interactions and feedback: batched, idempotent, tenant-scoped, nothing half-stored.

A batch is validated item by item; every item gets its own verdict (created / duplicate /
rejected, or recorded / pending / rejected for feedback). The items that pass are written in
one transaction: ``COPY`` on Postgres, a bulk insert elsewhere, never a save per row.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from apps.common.exceptions import PayloadTooLarge
from apps.common.lookups import ids_by_client_id, in_values, prepared_cursor, tenant_rows
from apps.common.observability.metrics import ingest_counted
from apps.interactions.models import Feedback, Interaction
from apps.interactions.rows import feedback_upsert_sql, interactions_bulk_insert, interactions_copy, json_text
from apps.interactions.sessions import conversation_outcome_record, conversation_outcomes_apply
from apps.interactions.validation import (
    FeedbackIn,
    InteractionIn,
    ItemError,
    feedback_validate,
    interaction_validate,
)
from apps.tenants.models import Tenant


@dataclass
class ItemResult:
    """The verdict on one item of a batch."""

    index: int
    status: str
    id: str | None = None
    client_id: str | None = None
    error: dict[str, str] | None = None
    conversation_id: str | None = None  # a session outcome

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "status": self.status}
        if self.id is not None:
            out["id"] = self.id
        if self.client_id is not None:
            out["client_id"] = self.client_id
        if self.conversation_id is not None:
            out["conversation_id"] = self.conversation_id
        if self.error is not None:
            out["error"] = self.error
        return out


def batch_check_size(items: Sequence[Any]) -> None:
    limit = settings.STROP_MAX_BATCH_ITEMS
    if len(items) > limit:
        raise PayloadTooLarge(
            f"items: a batch holds at most {limit} items, this one has {len(items)}; split it",
            details={"limit_items": limit, "items": len(items)},
        )


def _interaction_row(
    tenant: Tenant,
    item: InteractionIn,
    *,
    new_id: uuid.UUID,
    source: str,
    now: datetime,
    opted_in: bool,
    experiment: tuple[int, str] | None,
) -> tuple:
    return (
        new_id,
        tenant.pk,
        item.client_id,
        source,
        item.prompt,
        item.prefix,
        item.suffix,
        item.completion,
        json_text(item.prompt_token_ids),
        json_text(item.completion_token_ids),
        json_text(item.completion_logprobs),
        item.model_name,
        None,
        None,
        experiment[0] if experiment else None,
        experiment[1] if experiment else "",
        item.end_user_id,
        opted_in,
        item.served_at or now,
        now,
        item.latency_ms,
        json_text(item.metadata),
        json_text(item.messages),
        json_text(item.tools),
        item.conversation_id,
        item.turn,
    )


def _interactions_write(rows: list[tuple]) -> bool:
    """Write rows whose client ids were free a moment ago. False if some may not have landed,
    because a concurrent writer took their client ids first."""
    if connection.vendor == "postgresql":
        try:
            with transaction.atomic():
                interactions_copy(rows)
            return True
        except IntegrityError:
            pass  # a concurrent batch stored one of these client ids first: insert what is left
    interactions_bulk_insert(rows)
    return False


def interactions_ingest(
    tenant: Tenant,
    *,
    items: Sequence[Any],
    source: str = Interaction.Source.LOGGED,
    consent_default: bool = False,
    actor: str = "system",
) -> list[ItemResult]:
    """Store a batch of interactions; replaying a batch stores nothing new (idempotent on client_id).

    Each item's ``opted_in`` flag is its end user's consent now (see apps.cohorts.services);
    ``consent_default`` is the consent of users seen for the first time without one."""
    batch_check_size(items)
    now = timezone.now()
    results: list[ItemResult | None] = [None] * len(items)
    valid: list[tuple[int, InteractionIn]] = []
    for index, raw in enumerate(items):
        try:
            valid.append((index, interaction_validate(raw)))
        except ItemError as exc:
            client_id = (
                raw.get("client_id") if isinstance(raw, dict) and isinstance(raw.get("client_id"), str) else None
            )
            results[index] = ItemResult(index=index, status="rejected", client_id=client_id, error=exc.as_dict())
    if valid:
        with transaction.atomic():
            _interactions_store(
                tenant, valid, results, source=source, now=now, consent_default=consent_default, actor=actor
            )
    verdicts = [r for r in results if r is not None]
    ingest_counted("interactions", tenant.slug, verdicts)
    return verdicts


def _interactions_store(
    tenant: Tenant,
    valid: list[tuple[int, InteractionIn]],
    results: list[ItemResult | None],
    *,
    source: str,
    now: datetime,
    consent_default: bool,
    actor: str,
) -> None:
    from apps.cohorts.services import end_users_observe
    from apps.experiments.selectors import experiment_arms_of_logged

    client_ids = [item.client_id for _, item in valid]
    known = ids_by_client_id(Interaction, tenant.pk, client_ids)
    new: list[tuple[int, InteractionIn]] = []
    new_ids: dict[str, uuid.UUID] = {}
    for index, item in valid:
        if item.client_id in known or item.client_id in new_ids:
            existing = known.get(item.client_id) or new_ids[item.client_id]
            results[index] = ItemResult(index=index, status="duplicate", id=str(existing), client_id=item.client_id)
            continue
        new_ids[item.client_id] = uuid.uuid4()
        new.append((index, item))
    if not new:
        return
    consent = end_users_observe(
        tenant,
        observations=[(item.end_user_id, item.end_user_opted_in) for _, item in new],
        source="request",
        actor=actor,
        default=consent_default,
    )
    arms = experiment_arms_of_logged(tenant, [(item.model_name, item.end_user_id) for _, item in new])
    rows: list[tuple] = []
    for (index, item), opted_in, arm in zip(new, consent, arms, strict=True):
        new_id = new_ids[item.client_id]
        rows.append(
            _interaction_row(
                tenant,
                item,
                new_id=new_id,
                source=source,
                now=now,
                opted_in=opted_in,
                experiment=arm if opted_in else None,
            )
        )
        results[index] = ItemResult(index=index, status="created", id=str(new_id), client_id=item.client_id)
    if not _interactions_write(rows):
        stored = ids_by_client_id(Interaction, tenant.pk, new_ids)
        for result in results:
            if result is not None and result.status == "created" and stored[result.client_id] != uuid.UUID(result.id):
                result.status, result.id = "duplicate", str(stored[result.client_id])  # lost a race: theirs is kept
    feedback_attach_pending(tenant, client_ids=list(new_ids))
    conversations = {item.conversation_id for _, item in new if item.conversation_id}
    if conversations:
        if conversation_outcomes_apply(tenant, conversation_ids=conversations, now=now):
            _after_commit_notify_training(tenant.pk)


@dataclass
class _FeedbackRow:
    interaction_id: uuid.UUID | None
    pending_client_id: str | None
    item: FeedbackIn
    occurred_at: datetime
    events: int = 1


def _feedback_upsert(tenant: Tenant, rows: Iterable[_FeedbackRow], *, now: datetime) -> None:
    by_target: dict[str, list[tuple]] = {"interaction_id": [], "pending_client_id": []}
    adapt = connection.ops.adapt_datetimefield_value
    for row in rows:
        target = "interaction_id" if row.interaction_id is not None else "pending_client_id"
        interaction_id = (
            Interaction._meta.pk.get_db_prep_value(row.interaction_id, connection) if row.interaction_id else None
        )
        by_target[target].append(
            (
                tenant.pk,
                interaction_id,
                row.pending_client_id,
                row.item.outcome,
                row.item.kept_text,
                adapt(row.occurred_at),
                adapt(now),
                adapt(now),
                row.events,
                json_text(row.item.metadata),
            )
        )
    with prepared_cursor() as cursor:
        for target, params in by_target.items():
            sql = feedback_upsert_sql(target)
            if len(params) == 1:
                cursor.execute(sql, params[0])  # one round trip; executemany adds a pipeline sync
            elif params:
                cursor.executemany(sql, params)


def feedback_ingest(tenant: Tenant, *, items: Sequence[Any]) -> list[ItemResult]:
    """Record feedback; twice is counted once (last write wins), early feedback waits as pending."""
    batch_check_size(items)
    now = timezone.now()
    results: list[ItemResult | None] = [None] * len(items)
    valid: list[tuple[int, FeedbackIn]] = []
    for index, raw in enumerate(items):
        try:
            valid.append((index, feedback_validate(raw)))
        except ItemError as exc:
            results[index] = ItemResult(index=index, status="rejected", error=exc.as_dict())
    if valid:
        # One item is one upsert, atomic by itself: no BEGIN and COMMIT round trips for it.
        with transaction.atomic() if len(valid) > 1 else nullcontext():
            _feedback_store(tenant, valid, results, now=now)
    verdicts = [r for r in results if r is not None]
    ingest_counted("feedback", tenant.slug, verdicts)
    return verdicts


def _feedback_store(
    tenant: Tenant, valid: list[tuple[int, FeedbackIn]], results: list[ItemResult | None], *, now: datetime
) -> None:
    if len(valid) == 1 and _feedback_store_one(tenant, *valid[0], results, now=now):
        return
    ids = {item.interaction_id for _, item in valid if item.interaction_id is not None}
    client_ids = {item.client_id for _, item in valid if item.client_id is not None}
    known_ids = {row[0] for row in tenant_rows(Interaction, tenant.pk, key="id", values=ids, columns=("id",))}
    by_client_id = ids_by_client_id(Interaction, tenant.pk, client_ids)
    merged: dict[tuple[str, str], _FeedbackRow] = {}
    for index, item in valid:
        interaction_id: uuid.UUID | None = None
        if item.conversation_id is not None:
            if conversation_outcome_record(tenant, item=item, now=now):
                _after_commit_notify_training(tenant.pk)
            results[index] = ItemResult(index=index, status="recorded", conversation_id=item.conversation_id)
            continue
        if item.interaction_id is not None:
            if item.interaction_id not in known_ids:
                results[index] = ItemResult(
                    index=index,
                    status="rejected",
                    error={
                        "code": "not_found",
                        "message": f"interaction_id: no interaction {item.interaction_id}",
                        "field": "interaction_id",
                    },
                )
                continue
            interaction_id = item.interaction_id
        elif item.client_id in by_client_id:
            interaction_id = by_client_id[item.client_id]
        elif not tenant.accept_pending_feedback:
            results[index] = ItemResult(
                index=index,
                status="rejected",
                client_id=item.client_id,
                error={
                    "code": "unknown_interaction",
                    "message": f"client_id: no interaction {item.client_id!r} yet, and this tenant does not keep "
                    "feedback for interactions that have not arrived",
                    "field": "client_id",
                },
            )
            continue
        occurred_at = item.occurred_at or now
        key = ("i", str(interaction_id)) if interaction_id is not None else ("p", item.client_id or "")
        row = merged.get(key)
        if row is None:
            merged[key] = _FeedbackRow(interaction_id, None if interaction_id else item.client_id, item, occurred_at)
        else:
            row.events += 1
            if occurred_at >= row.occurred_at:
                row.item, row.occurred_at = item, occurred_at
        results[index] = ItemResult(
            index=index,
            status="recorded" if interaction_id is not None else "pending",
            id=str(interaction_id) if interaction_id is not None else None,
            client_id=item.client_id,
        )
    if merged:
        _feedback_upsert(tenant, merged.values(), now=now)
        if any(row.interaction_id is not None for row in merged.values()):
            _after_commit_notify_training(tenant.pk)


def _feedback_store_one(
    tenant: Tenant, index: int, item: FeedbackIn, results: list[ItemResult | None], *, now: datetime
) -> bool:
    """The single-item fast path; False when the general path must decide."""
    if connection.vendor != "postgresql" or item.conversation_id is not None:
        return False
    if item.interaction_id is not None:
        key, value = "id", item.interaction_id
    else:
        key, value = "client_id", item.client_id
    sql = feedback_upsert_sql("interaction_id", key)
    adapt = connection.ops.adapt_datetimefield_value
    occurred_at = item.occurred_at or now
    params = (
        tenant.pk,
        item.outcome,
        item.kept_text,
        adapt(occurred_at),
        adapt(now),
        adapt(now),
        json_text(item.metadata),
        tenant.pk,
        value,
    )
    with prepared_cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return False
    results[index] = ItemResult(index=index, status="recorded", id=str(row[0]), client_id=item.client_id)
    _after_commit_notify_training(tenant.pk)
    return True


def _feedback_merge(into: Feedback, other: Feedback) -> None:
    if other.occurred_at >= into.occurred_at or into.session_outcome_id is not None:
        into.outcome, into.kept_text, into.metadata = other.outcome, other.kept_text, other.metadata
        into.occurred_at, into.reward_weight, into.session_outcome = other.occurred_at, 1.0, None
    into.events_received += other.events_received
    into.received_at = min(into.received_at, other.received_at)
    into.updated_at = timezone.now()


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
        waiting = list(pending.select_for_update())
        ids = dict(
            Interaction.objects.filter(
                tenant=tenant, **in_values("client_id", [f.pending_client_id for f in waiting])
            ).values_list("client_id", "id")
        )
        for feedback in waiting:
            interaction_id = ids.get(feedback.pending_client_id)
            if interaction_id is None:
                continue
            existing = Feedback.objects.select_for_update().filter(tenant=tenant, interaction_id=interaction_id).first()
            if existing is not None:
                _feedback_merge(existing, feedback)
                feedback.delete()
                existing.save()
            else:
                feedback.interaction_id, feedback.pending_client_id = interaction_id, None
                feedback.save(update_fields=["interaction", "pending_client_id"])
            attached += 1
        if attached:
            _after_commit_notify_training(tenant.pk)
    return attached


def _after_commit_notify_training(tenant_id: int) -> None:
    """New labelled events may be enough for a training run: ask the scheduler once committed."""

    def notify() -> None:
        from apps.training.services import training_check_soon

        training_check_soon(tenant_id)

    transaction.on_commit(notify)


def feedback_attach_pending_all() -> int:
    """The sweeper: attach pending feedback of every tenant whose interaction has arrived."""
    tenant_ids = set(
        Feedback.objects.filter(pending_client_id__isnull=False).values_list("tenant_id", flat=True).distinct()
    )
    return sum(feedback_attach_pending(tenant) for tenant in Tenant.objects.filter(pk__in=tenant_ids))
