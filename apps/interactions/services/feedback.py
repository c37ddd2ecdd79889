"""Ingestion of feedback: one row per interaction (merged by the time the user acted), kept as
pending when its interaction has not arrived yet (never for one an erase or retention removed), and
session outcomes spread over their turns."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol, TypeVar

from django.db import connection, transaction
from django.db.models import QuerySet
from django.db.models.functions import Length
from django.utils import timezone

from apps.cohorts.erased import erased_among, erased_label_error
from apps.common.item_checks import ItemError
from apps.common.lookups import ids_by_client_id, in_values, prepared_cursor, tenant_rows
from apps.common.observability.metrics import ingest_counted
from apps.interactions.models import Feedback, Interaction
from apps.interactions.rows import feedback_upsert_sql, interactions_held, json_text
from apps.interactions.selectors import stream_open_ids
from apps.interactions.served import SERVED_BY_KEY
from apps.interactions.services.batches import ItemResult, batch_check_size, label_before_settled_error, settled_before
from apps.interactions.sessions import conversation_outcome_record
from apps.interactions.training_check import training_check_soon
from apps.interactions.validation import FeedbackIn, accepted_chars_range_error, feedback_validate
from apps.tenants.models import Tenant


@dataclass
class _FeedbackRow:
    interaction_id: uuid.UUID | None
    pending_client_id: str | None
    item: FeedbackIn
    occurred_at: datetime
    events: int = 1


def _feedback_upsert(tenant: Tenant, rows: Iterable[_FeedbackRow], *, now: datetime) -> None:
    """Upsert the rows, in the order of their keys whatever the batch's: two batches that name the
    same interactions wait on each other's rows in the same order (one waits, the other finishes),
    never each on the other's (a deadlock)."""
    by_target: dict[str, list[tuple]] = {"interaction_id": [], "pending_client_id": []}
    adapt = connection.ops.adapt_datetimefield_value
    for row in sorted(rows, key=lambda r: str(r.interaction_id) if r.interaction_id else r.pending_client_id or ""):
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
                row.item.accepted_chars,
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


def feedback_ingest(tenant: Tenant, *, items: Sequence[Any], served_by: str | None = None) -> list[ItemResult]:
    """Record feedback; twice is counted once (last write wins), early feedback waits as pending.

    ``served_by`` (an editor key's prefix): only feedback on interactions that key served (or its
    editor outcomes made) is taken; any other id is not found, as if it did not exist, and nothing
    waits as pending nor lands on a session."""
    batch_check_size(items)
    now = timezone.now()
    results: list[ItemResult | None] = [None] * len(items)
    valid: list[tuple[int, FeedbackIn]] = []
    for index, raw in enumerate(items):
        try:
            valid.append((index, feedback_validate(raw)))
        except ItemError as exc:
            results[index] = ItemResult(index=index, status="rejected", error=exc.as_dict())
    if served_by is not None:
        valid = served_by_only(tenant, valid, results, prefix=served_by)
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
    open_ids = stream_open_ids(tenant, ids=ids - known_ids)  # their interaction is on its way
    known_ids |= _ended_streams(tenant, ids - known_ids - open_ids)
    by_client_id = ids_by_client_id(Interaction, tenant.pk, client_ids)
    named = known_ids | set(by_client_id.values())
    # The interactions found are held until the labels on them are written (a single item's in a
    # transaction of its own): one deleted meanwhile is gone now, and answered so (rows.interactions_held).
    with transaction.atomic(savepoint=False) if named else nullcontext():
        held = interactions_held(tenant.pk, named)
        known_ids &= held
        by_client_id = {client_id: pk for client_id, pk in by_client_id.items() if pk in held}
        _feedback_write(tenant, valid, results, known_ids, open_ids, by_client_id, now=now)


def _feedback_write(
    tenant: Tenant,
    valid: list[tuple[int, FeedbackIn]],
    results: list[ItemResult | None],
    known_ids: set[uuid.UUID],
    open_ids: set[uuid.UUID],
    by_client_id: dict[str, uuid.UUID],
    *,
    now: datetime,
) -> None:
    client_ids = {item.client_id for _, item in valid if item.client_id is not None}
    lengths = _completion_lengths(tenant, valid, known_ids, by_client_id)
    # Labels that would wait for what an erase removed are refused (apps.cohorts.erased), and so are
    # those that would wait for what retention removed (apps.interactions.rollups).
    erased_clients = erased_among(tenant.pk, "client", client_ids - set(by_client_id))
    erased_sessions = erased_sessions_among(tenant, {i.conversation_id for _, i in valid if i.conversation_id})
    waiting = [i for _, i in valid if i.client_id is not None and i.client_id not in by_client_id]
    settled = settled_before(tenant, (i.occurred_at for i in waiting), now=now)
    merged: dict[tuple[str, str], _FeedbackRow] = {}
    for index, item in valid:
        interaction_id: uuid.UUID | None = None
        if item.conversation_id is not None and item.conversation_id in erased_sessions:
            error = erased_label_error("conversation_id", item.conversation_id)
            results[index] = ItemResult(index=index, status="rejected", error=error)
            continue
        if item.conversation_id is not None:
            if conversation_outcome_record(tenant, item=item, now=now):
                training_check_on_commit(tenant.pk)
            results[index] = ItemResult(index=index, status="recorded", conversation_id=item.conversation_id)
            continue
        if item.interaction_id is not None and item.interaction_id in open_ids:
            pass  # pending under its id until its stream's end (or the sweeper) records it
        elif item.interaction_id is not None:
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
        elif item.client_id in erased_clients:
            error = erased_label_error("client_id", item.client_id)
            results[index] = ItemResult(index=index, status="rejected", client_id=item.client_id, error=error)
            continue
        elif settled is not None and item.occurred_at is not None and item.occurred_at < settled:
            error = label_before_settled_error("client_id", item.client_id or "", item.occurred_at, settled)
            results[index] = ItemResult(index=index, status="rejected", client_id=item.client_id, error=error)
            continue
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
        if item.accepted_chars is not None and interaction_id is not None:
            length = lengths[interaction_id]
            if item.accepted_chars >= length:
                results[index] = ItemResult(
                    index=index,
                    status="rejected",
                    client_id=item.client_id,
                    error=accepted_chars_range_error(item.accepted_chars, length).as_dict(),
                )
                continue
        occurred_at = item.occurred_at or now
        waits_as = str(item.interaction_id) if item.interaction_id is not None else item.client_id
        key = ("i", str(interaction_id)) if interaction_id is not None else ("p", waits_as or "")
        row = merged.get(key)
        if row is None:
            merged[key] = _FeedbackRow(interaction_id, None if interaction_id else waits_as, item, occurred_at)
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
            training_check_on_commit(tenant.pk)


def erased_sessions_among(tenant: Tenant, conversation_ids: set[str]) -> set[str]:
    """The sessions an erase removed and that hold no turn now: an outcome for one would wait for
    turns that are gone. A session the user went on with after the erase has turns again."""
    erased = erased_among(tenant.pk, "conversation", conversation_ids)
    if not erased:
        return set()
    going_on = Interaction.objects.filter(tenant=tenant, **in_values("conversation_id", erased)).values_list(
        "conversation_id", flat=True
    )
    return erased - set(going_on)


def _ended_streams(
    tenant: Tenant, missing: set[uuid.UUID], *, own: QuerySet[Interaction] | None = None
) -> set[uuid.UUID]:
    """Which ``missing`` ids (neither an interaction nor an open stream) are interactions now: a
    stream that ended between the two reads (its end deletes its parts and records its interaction in
    one transaction, so the later read sees it). No query for no ids: the common case."""
    if not missing:
        return set()
    if own is not None:
        return set(own.filter(**in_values("id", missing)).values_list("id", flat=True))
    return {row[0] for row in tenant_rows(Interaction, tenant.pk, key="id", values=missing, columns=("id",))}


class NamesAnInteraction(Protocol):
    """An item that names an interaction: feedback, or a persistence report (never a session)."""

    interaction_id: uuid.UUID | None
    client_id: str | None
    conversation_id: str | None


Item = TypeVar("Item", bound=NamesAnInteraction)


def served_by_only(
    tenant: Tenant, valid: list[tuple[int, Item]], results: list[ItemResult | None], *, prefix: str
) -> list[tuple[int, Item]]:
    """The items that name an interaction the key ``prefix`` served; the others rejected as not found."""
    ids = {item.interaction_id for _, item in valid if item.interaction_id is not None}
    client_ids = {item.client_id for _, item in valid if item.interaction_id is None and item.client_id is not None}
    own = Interaction.objects.filter(tenant=tenant, **{f"metadata__{SERVED_BY_KEY}": prefix})
    own_ids = set(own.filter(**in_values("id", ids)).values_list("id", flat=True)) if ids else set()
    own_ids |= stream_open_ids(tenant, ids=ids - own_ids, served_by_key=prefix)
    own_ids |= _ended_streams(tenant, ids - own_ids, own=own)
    own_client_ids = (
        set(own.filter(**in_values("client_id", client_ids)).values_list("client_id", flat=True))
        if client_ids
        else set()
    )
    kept: list[tuple[int, Item]] = []
    for index, item in valid:
        if item.conversation_id is not None:
            field, named = "conversation_id", item.conversation_id
        elif item.interaction_id is not None:
            field, named = "interaction_id", str(item.interaction_id)
        else:
            field, named = "client_id", item.client_id or ""
        if item.interaction_id in own_ids or (item.interaction_id is None and item.client_id in own_client_ids):
            kept.append((index, item))
            continue
        error = {
            "code": "not_found",
            "message": f"{field}: no interaction {named!r} served through this editor key "
            "(an editor key sends feedback only on the completions it served)",
            "field": field,
        }
        results[index] = ItemResult(index=index, status="rejected", client_id=item.client_id, error=error)
    return kept


def _completion_lengths(
    tenant: Tenant,
    valid: list[tuple[int, FeedbackIn]],
    known_ids: set[uuid.UUID],
    by_client_id: dict[str, uuid.UUID],
) -> dict[uuid.UUID, int]:
    """The completion length (characters) of each stored interaction a partial accept names: the
    bound of its ``accepted_chars``. No query when the items hold no partial accept."""
    named: set[uuid.UUID] = set()
    for _, item in valid:
        if item.accepted_chars is None:
            continue
        if item.interaction_id in known_ids:
            named.add(item.interaction_id)
        elif item.client_id in by_client_id:
            named.add(by_client_id[item.client_id])
    if not named:
        return {}
    rows = Interaction.objects.filter(tenant=tenant, **in_values("id", named)).annotate(length=Length("completion"))
    return dict(rows.values_list("id", "length"))


def _feedback_store_one(
    tenant: Tenant, index: int, item: FeedbackIn, results: list[ItemResult | None], *, now: datetime
) -> bool:
    """The single-item fast path; False when the general path must decide (a partial accept too:
    its ``accepted_chars`` is checked against the completion's length)."""
    if connection.vendor != "postgresql" or item.conversation_id is not None or item.accepted_chars is not None:
        return False
    value: Any
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
    training_check_on_commit(tenant.pk)
    return True


def feedback_merge(into: Feedback, other: Feedback) -> None:
    if other.occurred_at >= into.occurred_at or into.session_outcome_id is not None:
        into.outcome, into.kept_text, into.metadata = other.outcome, other.kept_text, other.metadata
        into.accepted_chars = other.accepted_chars
        into.occurred_at, into.reward_weight, into.session_outcome = other.occurred_at, 1.0, None
    into.events_received += other.events_received
    into.received_at = min(into.received_at, other.received_at)
    into.updated_at = timezone.now()


def training_check_on_commit(tenant_id: int) -> None:
    """New labelled events may be enough for a training run: ask the scheduler once committed."""
    transaction.on_commit(lambda: training_check_soon(tenant_id))
