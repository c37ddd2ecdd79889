"""Ingestion of interactions: batched, idempotent on ``client_id``, tenant-scoped, nothing
half-stored. The items that pass validation are written in one transaction: ``COPY`` on
Postgres, a bulk insert elsewhere, never a save per row. A new interaction whose client id an erase
removed, or served in an hour retention has settled, is refused (its item rejected)."""

from __future__ import annotations

import functools
import operator
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from apps.cohorts.erased import erased_among
from apps.cohorts.services import end_users_observe
from apps.common.item_checks import ItemError
from apps.common.lookups import ids_by_client_id
from apps.common.observability.metrics import ingest_counted
from apps.interactions.arms import arms_of_logged
from apps.interactions.ids import time_ids
from apps.interactions.models import Interaction
from apps.interactions.packed import pack_floats, pack_ids
from apps.interactions.rows import (
    INTERACTION_COLUMNS,
    interactions_bulk_insert,
    interactions_copy,
    json_text,
)
from apps.interactions.services.batches import (
    ItemResult,
    batch_check_size,
    served_before_settled_error,
    settled_before,
)
from apps.interactions.services.feedback import training_check_on_commit
from apps.interactions.services.pending import feedback_attach_pending, pending_kinds
from apps.interactions.services.persistence import persistence_attach_pending
from apps.interactions.sessions import conversation_outcomes_apply
from apps.interactions.validation import InteractionIn, interaction_validate
from apps.tenants.models import Tenant


def _interaction_row(
    tenant: Tenant,
    item: InteractionIn,
    *,
    new_id: uuid.UUID | str,
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
        pack_ids(item.prompt_token_ids),
        pack_ids(item.completion_token_ids),
        pack_floats(item.completion_logprobs),
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
        # An agent's tool calls are where a served turn keeps them (apps.interactions.served).
        json_text({**item.metadata, "tool_calls": item.tool_calls} if item.tool_calls else item.metadata),
        json_text(item.messages),
        json_text(item.tools),
        item.conversation_id,
        item.turn,
    )


_CLIENT_ID = operator.itemgetter(INTERACTION_COLUMNS.index("client_id"))


def _interactions_write(rows: list[tuple], *, optimistic: bool) -> bool:
    """Write rows whose client ids were free a moment ago (``optimistic``: not looked up at all,
    and a taken one raises ``IntegrityError`` for the caller to store the batch again the careful
    way). False if some may not have landed, because a concurrent writer took their client ids first."""
    if optimistic:
        interactions_copy(rows)  # in the caller's transaction: no savepoint round trips
        return True
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
        store = functools.partial(
            _interactions_store,
            tenant,
            valid,
            results,
            source=source,
            now=now,
            consent_default=consent_default,
            actor=actor,
        )
        # Postgres: a batch is first written as if none of its client ids were stored (no lookup,
        # one COPY in the transaction); if one was, nothing of that attempt stays, and the batch is
        # stored again with the lookup, its replays answered as duplicates.
        optimistic = connection.vendor == "postgresql"
        try:
            with transaction.atomic():
                store(optimistic=optimistic)
        except IntegrityError:
            if not optimistic:
                raise
            for index, _ in valid:
                results[index] = None
            with transaction.atomic():
                store(optimistic=False)
    verdicts = [r for r in results if r is not None]
    ingest_counted("interactions", tenant.slug, verdicts)
    return verdicts


def _refusal(item: InteractionIn, *, erased: set[str], settled: datetime | None) -> dict[str, str] | None:
    """Why a new interaction is not stored (its verdict's error), or None."""
    if item.client_id in erased:
        return {
            "code": "erased",
            "message": f"client_id: the interaction {item.client_id[:200]!r} was erased with its end user; "
            "it is not stored again",
            "field": "client_id",
        }
    if settled is not None and item.served_at is not None and item.served_at < settled:
        return served_before_settled_error(item.served_at, settled)
    return None


def _interactions_store(
    tenant: Tenant,
    valid: list[tuple[int, InteractionIn]],
    results: list[ItemResult | None],
    *,
    source: str,
    now: datetime,
    consent_default: bool,
    actor: str,
    optimistic: bool,
) -> None:
    client_ids = [item.client_id for _, item in valid]
    # Served in an hour retention has settled: refused (apps.interactions.rollups), unless stored (kept
    # by an experiment or a training window), which a replay must still find as a duplicate. Read under
    # the rollup lock, shared: a retention batch deleting now has committed, or waits for this one.
    settled = settled_before(tenant, (item.served_at for _, item in valid), now=now, hold=True)
    late = settled is not None and any(item.served_at is not None and item.served_at < settled for _, item in valid)
    known = {} if optimistic and not late else ids_by_client_id(Interaction, tenant.pk, client_ids)
    # What an erase removed is not brought back by sending it again (apps.cohorts.erased).
    erased = erased_among(tenant.pk, "client", (c for c in client_ids if c not in known))
    new: list[tuple[int, InteractionIn]] = []
    new_ids: dict[str, str] = {}
    fresh = time_ids([item.served_at or now for _, item in valid])  # ids sort by served time (ids.py)
    for (index, item), fresh_id in zip(valid, fresh, strict=True):
        if item.client_id in known or item.client_id in new_ids:
            existing = known.get(item.client_id) or new_ids[item.client_id]
            results[index] = ItemResult(index=index, status="duplicate", id=str(existing), client_id=item.client_id)
            continue
        error = _refusal(item, erased=erased, settled=settled)
        if error is not None:
            results[index] = ItemResult(index=index, status="rejected", client_id=item.client_id, error=error)
            continue
        new_ids[item.client_id] = fresh_id
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
    # Only an opted-in interaction is tagged with its arm: none to look up when nobody opted in.
    opted = [(item.model_name, item.end_user_id) for (_, item), opted_in in zip(new, consent, strict=True) if opted_in]
    found = iter(arms_of_logged(tenant, opted) if opted else [])
    arms = [next(found) if opted_in else None for opted_in in consent]
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
        results[index] = ItemResult(index=index, status="created", id=new_id, client_id=item.client_id)
    # In client id order: two batches that share client ids then wait on each other's rows in the
    # same order (one waits, the other finishes), never each on the other's (a deadlock).
    rows.sort(key=_CLIENT_ID)
    if not _interactions_write(rows, optimistic=optimistic):
        stored = ids_by_client_id(Interaction, tenant.pk, new_ids)
        for result in results:
            if (
                result is not None
                and result.status == "created"
                and result.client_id is not None
                and stored[result.client_id] != uuid.UUID(result.id)
            ):
                result.status, result.id = "duplicate", str(stored[result.client_id])  # lost a race: theirs is kept
    waiting = pending_kinds(tenant, client_ids=list(new_ids))
    if "feedback" in waiting:
        feedback_attach_pending(tenant, client_ids=list(new_ids))
    if "persistence" in waiting:
        persistence_attach_pending(tenant, client_ids=list(new_ids))
    conversations = {item.conversation_id for _, item in new if item.conversation_id}
    if conversations:
        if conversation_outcomes_apply(tenant, conversation_ids=conversations, now=now):
            training_check_on_commit(tenant.pk)
