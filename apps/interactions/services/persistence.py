"""Persistence reports: what is left of an accepted completion at a checkpoint after the accept,
measured as retained characters (apps.interactions.retention) and stored one row per (interaction,
checkpoint). They are taken as feedback is: a report sent twice is counted once and the latest
measurement (``occurred_at``) wins; checkpoints may arrive in any order; a report naming a client id
not seen yet waits as pending (unless the tenant refuses pending feedback, or an erase or retention
removed it) and is measured when its interaction arrives; an editor key reports only on what it served."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from apps.cohorts.erased import erased_among, erased_label_error
from apps.common.exceptions import PayloadTooLarge
from apps.common.item_checks import ItemError
from apps.common.lookups import in_values
from apps.common.observability.metrics import ingest_counted
from apps.interactions.models import Interaction, PersistenceReport
from apps.interactions.persistence_validation import PersistenceIn, accepted_chars_too_long, persistence_validate
from apps.interactions.retention import MAX_BATCH_TEXT, retained_from_ratio, retention_measure
from apps.interactions.rows import interactions_held, json_text
from apps.interactions.services.batches import ItemResult, batch_check_size, label_before_settled_error, settled_before
from apps.interactions.services.feedback import served_by_only
from apps.interactions.services.pending import pending_attach_all
from apps.tenants.models import Tenant


@dataclass
class ReportResult(ItemResult):
    """An item's verdict, with what was measured (a recorded report)."""

    checkpoint_s: int | None = None
    accepted_chars: int | None = None
    retained_chars: int | None = None

    def as_dict(self) -> dict[str, Any]:
        out = super().as_dict()
        for name in ("checkpoint_s", "accepted_chars", "retained_chars"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


def nothing_to_retain_error() -> ItemError:
    return ItemError(
        "interaction_id",
        "the completion is empty (nothing was suggested, so nothing was accepted to keep)",
        "nothing_to_retain",
    )


def persistence_measure(
    completion: str, *, accepted_chars: int | None, text: str | None, ratio: float | None
) -> tuple[int, int, str]:
    """(accepted, retained characters, the stretch of the text they were found in) of one report
    against its completion: the accepted text is the completion, or its first ``accepted_chars`` (a
    partial accept, capped at the completion). A ratio the client measured finds no stretch."""
    accepted = completion[: min(accepted_chars, len(completion))] if accepted_chars is not None else completion
    if ratio is not None:
        return len(accepted), retained_from_ratio(len(accepted), ratio), ""
    retained, stretch = retention_measure(accepted, text or "")
    return len(accepted), retained, stretch


@dataclass
class _Row:
    interaction_id: uuid.UUID | None
    pending_client_id: str | None
    item: PersistenceIn
    occurred_at: datetime
    accepted: int | None = None
    retained: int | None = None
    kept_text: str = ""
    events: int = 1


def persistence_ingest(tenant: Tenant, *, items: Sequence[Any], served_by: str | None = None) -> list[ItemResult]:
    """Record persistence reports: recorded (measured now), pending (waiting for the interaction) or
    rejected, per item. ``served_by`` (an editor key's prefix): only reports on what that key served."""
    batch_check_size(items)
    _check_batch_text(items)
    now = timezone.now()
    results: list[ItemResult | None] = [None] * len(items)
    valid: list[tuple[int, PersistenceIn]] = []
    for index, raw in enumerate(items):
        try:
            valid.append((index, persistence_validate(raw)))
        except ItemError as exc:
            results[index] = ItemResult(index=index, status="rejected", error=exc.as_dict())
    if served_by is not None:
        valid = served_by_only(tenant, valid, results, prefix=served_by)
    if valid:
        with transaction.atomic():
            _persistence_store(tenant, valid, results, now=now)
    verdicts = [r for r in results if r is not None]
    ingest_counted("persistence", tenant.slug, verdicts)
    return verdicts


def _check_batch_text(items: Sequence[Any]) -> None:
    """Bound one request's measuring work: the texts of a batch together, not only each one."""
    total = sum(len(i["text"]) for i in items if isinstance(i, dict) and isinstance(i.get("text"), str))
    if total > MAX_BATCH_TEXT:
        raise PayloadTooLarge(
            f"items: a batch holds at most {MAX_BATCH_TEXT} characters of text in all, this one has {total}; split it",
            details={"limit_text_chars": MAX_BATCH_TEXT, "text_chars": total},
        )


def _rejected(index: int, item: PersistenceIn, error: ItemError | dict[str, str]) -> ItemResult:
    body = error.as_dict() if isinstance(error, ItemError) else error
    return ItemResult(index=index, status="rejected", client_id=item.client_id, error=body)


def _persistence_store(
    tenant: Tenant, valid: list[tuple[int, PersistenceIn]], results: list[ItemResult | None], *, now: datetime
) -> None:
    ids = {item.interaction_id for _, item in valid if item.interaction_id is not None}
    client_ids = {item.client_id for _, item in valid if item.client_id is not None}
    interactions = Interaction.objects.filter(tenant=tenant)
    by_id = dict(interactions.filter(**in_values("id", ids)).values_list("id", "completion")) if ids else {}
    by_client_id = (
        {
            c: (i, text)
            for c, i, text in interactions.filter(**in_values("client_id", client_ids)).values_list(
                "client_id", "id", "completion"
            )
        }
        if client_ids
        else {}
    )
    # The interactions found are held until the reports on them are written: one deleted meanwhile
    # is gone now, and answered so (apps.interactions.rows.interactions_held).
    held = interactions_held(tenant.pk, set(by_id) | {pk for pk, _ in by_client_id.values()})
    by_id = {pk: completion for pk, completion in by_id.items() if pk in held}
    by_client_id = {c: found for c, found in by_client_id.items() if found[0] in held}
    # A report that would wait for what an erase removed is refused (apps.cohorts.erased), and so is
    # one that would wait for what retention removed (apps.interactions.rollups).
    erased = erased_among(tenant.pk, "client", client_ids - set(by_client_id))
    waiting = [i for _, i in valid if i.client_id is not None and i.client_id not in by_client_id]
    settled = settled_before(tenant, (i.occurred_at for i in waiting), now=now)
    merged: dict[tuple[str, str, int], _Row] = {}
    for index, item in valid:
        interaction_id: uuid.UUID | None = None
        completion: str | None = None
        if item.interaction_id is not None:
            if item.interaction_id not in by_id:
                message = f"interaction_id: no interaction {item.interaction_id}"
                results[index] = _rejected(
                    index, item, {"code": "not_found", "message": message, "field": "interaction_id"}
                )
                continue
            interaction_id, completion = item.interaction_id, by_id[item.interaction_id]
        elif item.client_id in by_client_id:
            interaction_id, completion = by_client_id[item.client_id]
        elif item.client_id in erased:
            results[index] = _rejected(index, item, erased_label_error("client_id", item.client_id))
            continue
        elif settled is not None and item.occurred_at is not None and item.occurred_at < settled:
            error = label_before_settled_error("client_id", item.client_id or "", item.occurred_at, settled)
            results[index] = _rejected(index, item, error)
            continue
        elif not tenant.accept_pending_feedback:
            message = (
                f"client_id: no interaction {item.client_id!r} yet, and this tenant does not keep reports for "
                "interactions that have not arrived"
            )
            results[index] = _rejected(
                index, item, {"code": "unknown_interaction", "message": message, "field": "client_id"}
            )
            continue
        row = _Row(interaction_id, None if interaction_id else item.client_id, item, item.occurred_at or now)
        if completion is not None:
            if not completion:
                results[index] = _rejected(index, item, nothing_to_retain_error())
                continue
            if item.accepted_chars is not None and item.accepted_chars > len(completion):
                results[index] = _rejected(index, item, accepted_chars_too_long(item.accepted_chars, len(completion)))
                continue
            row.accepted, row.retained, row.kept_text = persistence_measure(
                completion, accepted_chars=item.accepted_chars, text=item.text, ratio=item.retained_ratio
            )
        else:
            row.accepted = item.accepted_chars
        key = (
            ("i", str(interaction_id), item.checkpoint_s)
            if interaction_id
            else ("p", item.client_id or "", item.checkpoint_s)
        )
        earlier = merged.get(key)
        if earlier is None:
            merged[key] = row
        else:
            row.events = earlier.events + 1
            merged[key] = row if row.occurred_at >= earlier.occurred_at else earlier
            merged[key].events = row.events
        results[index] = ReportResult(
            index=index,
            status="recorded" if interaction_id else "pending",
            id=str(interaction_id) if interaction_id else None,
            client_id=item.client_id,
            checkpoint_s=item.checkpoint_s,
            accepted_chars=row.accepted if interaction_id else None,
            retained_chars=row.retained,
        )
    if merged:
        _persistence_upsert(tenant, list(merged.values()), now=now)


_COLUMNS = (
    "tenant_id, interaction_id, pending_client_id, checkpoint_s, accepted_chars, retained_chars, reported_ratio, "
    "pending_text, kept_text, occurred_at, received_at, updated_at, events_received, metadata"
)
_LATEST_WINS = (
    "accepted_chars",
    "retained_chars",
    "reported_ratio",
    "pending_text",
    "kept_text",
    "metadata",
    "occurred_at",
)


@functools.cache
def _upsert_sql(target: str) -> str:
    """Insert a report, or merge it into the one stored for its checkpoint: the latest reading wins,
    every event is counted."""
    table = connection.ops.quote_name(PersistenceReport._meta.db_table)
    newer = f"excluded.occurred_at >= {table}.occurred_at"
    latest = ",\n    ".join(
        f"{name} = CASE WHEN {newer} THEN excluded.{name} ELSE {table}.{name} END" for name in _LATEST_WINS
    )
    return (
        f"INSERT INTO {table} ({_COLUMNS}) VALUES ({', '.join(['%s'] * 14)})\n"
        f"ON CONFLICT (tenant_id, {target}, checkpoint_s) WHERE {target} IS NOT NULL DO UPDATE SET\n    {latest},\n"
        f"    updated_at = excluded.updated_at, events_received = {table}.events_received + excluded.events_received"
    )


def _persistence_upsert(tenant: Tenant, rows: list[_Row], *, now: datetime) -> None:
    """Upsert the rows in the order of their keys, whatever the batch's (as feedback's: two batches
    naming the same reports then never deadlock)."""
    adapt = connection.ops.adapt_datetimefield_value
    by_target: dict[str, list[tuple]] = {"interaction_id": [], "pending_client_id": []}
    for row in sorted(rows, key=_upsert_order):
        pending = row.interaction_id is None
        by_target["pending_client_id" if pending else "interaction_id"].append(
            (
                tenant.pk,
                None if pending else Interaction._meta.pk.get_db_prep_value(row.interaction_id, connection),
                row.pending_client_id,
                row.item.checkpoint_s,
                row.accepted,
                row.retained,
                row.item.retained_ratio,
                (row.item.text or "") if pending else "",  # kept only until it can be measured
                row.kept_text,
                adapt(row.occurred_at),
                adapt(now),
                adapt(now),
                row.events,
                json_text(row.item.metadata),
            )
        )
    with connection.cursor() as cursor:
        for target, params in by_target.items():
            if params:
                cursor.executemany(_upsert_sql(target), params)


def _upsert_order(row: _Row) -> tuple[str, int]:
    return str(row.interaction_id) if row.interaction_id else row.pending_client_id or "", row.item.checkpoint_s


def persistence_attach_pending(tenant: Tenant, *, client_ids: Sequence[str] | None = None) -> int:
    """Measure and attach reports that arrived before their interaction; how many were attached.

    Called in the transaction that stores interactions, and by the pending sweeper."""
    pending = PersistenceReport.objects.filter(tenant=tenant, pending_client_id__isnull=False)
    if client_ids is not None:
        pending = pending.filter(**in_values("pending_client_id", client_ids))
    if not pending.exists():  # the common case on the ingest hot path: one indexed probe
        return 0
    attached = 0
    with transaction.atomic():
        waiting = list(pending.select_for_update().order_by("pk"))  # in key order, as retention locks them
        found = {
            client_id: (interaction_id, completion)
            for client_id, interaction_id, completion in Interaction.objects.filter(
                tenant=tenant, **in_values("client_id", {r.pending_client_id for r in waiting})
            ).values_list("client_id", "id", "completion")
        }
        for report in waiting:
            if report.pending_client_id not in found:
                continue
            interaction_id, completion = found[report.pending_client_id]
            report.accepted_chars, report.retained_chars, report.kept_text = persistence_measure(
                completion, accepted_chars=report.accepted_chars, text=report.pending_text, ratio=report.reported_ratio
            )
            report.interaction_id, report.pending_client_id, report.pending_text = interaction_id, None, ""
            existing = (
                PersistenceReport.objects.select_for_update()
                .filter(tenant=tenant, interaction_id=interaction_id, checkpoint_s=report.checkpoint_s)
                .first()
            )
            if existing is None:
                report.save()
            else:
                _merge(existing, report)
                report.delete()
                existing.save()
            attached += 1
    return attached


def _merge(into: PersistenceReport, other: PersistenceReport) -> None:
    if other.occurred_at >= into.occurred_at:
        for name in _LATEST_WINS:
            setattr(into, name, getattr(other, name))
    into.events_received += other.events_received
    into.received_at = min(into.received_at, other.received_at)
    into.updated_at = timezone.now()


def persistence_attach_pending_all() -> int:
    """The sweeper: attach pending reports of every tenant whose interaction has arrived."""
    return pending_attach_all(PersistenceReport, persistence_attach_pending, what="pending persistence reports")
