"""Open streams' parts: what a stream served, written as it goes (``apps.serving.stream_record``), so
that a worker killed outright (SIGKILL, the OOM killer, a crash) loses only what it served since.

A part is never an interaction: training, experiment metrics and the dashboard read interactions
only, so nothing half-written reaches them. A stream's end records its interaction as it always did
and deletes its parts (:func:`stream_parts_recorded`); the sweeper (:func:`stream_parts_sweep`,
beat) records a stream whose parts were not written for ``STROP_SERVING_STALE_STREAM_S`` (its worker
died) from them: what was served up to the last write, ``"partial": true`` in its metadata. Feedback
on an open stream's id waits as pending (under the id, in ``pending_client_id``) and is attached in
either case, as feedback that came before its interaction is (``services.pending``). A stream the
sweeper gives up on is recorded as a serving failure with its id, as one vLLM failed: an erase of its
user finds the feedback still waiting on it there.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import orjson
from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import Max
from django.utils import timezone

from apps.common.lookups import prepared_cursor
from apps.interactions.models import ServingFailure, StreamPart
from apps.interactions.packed import pack_floats, pack_ids, unpack_ids
from apps.interactions.rows import (
    INTERACTION_COLUMNS,
    interactions_bulk_insert,
    interactions_upsert,
    json_text,
    row_values,
    values_sql,
)
from apps.interactions.services.pending import feedback_attach_pending, pending_kinds
from apps.interactions.sessions import conversation_outcomes_apply
from apps.tenants.models import Tenant

logger = logging.getLogger(__name__)

# What a part holds of its interaction's row (the rest is the head's, written once).
_SERVED = ("completion", "completion_token_ids", "completion_logprobs", "latency_ms", "metadata", "received_at")
_PART_COLUMNS = (
    "tenant_id",
    "interaction_id",
    "seq",
    "written_at",
    "head",
    "completion",
    "completion_token_ids",
    "completion_logprobs",
    "metadata",
)
# A part's key for its tool calls' new text: ``[{"index", "arguments"[, "id"][, "name"]}]``, only the
# arguments served since the part before (an id or a name when it changed); joined by _partial_row.
TOOL_CALLS_SINCE = "tool_calls_since"
# Streams one sweep records at most (the next sweep takes the rest).
SWEEP_STREAMS = 500
# A stale stream the sweeper still cannot record this long after its last write (a part it cannot
# read: a bug) is dropped, so that the oldest never hold the front of the sweep forever.
SWEEP_GIVE_UP = timedelta(hours=1)


@dataclass
class Part:
    """What one choice of an open stream served since its last write (``seq``: the writes before)."""

    tenant_id: int
    interaction_id: uuid.UUID
    seq: int
    completion: str
    completion_token_ids: list[int]
    completion_logprobs: list[float]
    metadata: dict[str, Any]  # its first part: the interaction's; later ones: what changed
    head: dict[str, Any] | None = None  # its first part: the rest of the row (:func:`stream_part_head`)


def stream_part_head(row: tuple) -> tuple[dict[str, Any], dict[str, Any]]:
    """A served row (``apps.interactions.served.served_rows``) as a first part's head and metadata."""
    values = dict(zip(INTERACTION_COLUMNS, row, strict=True))
    metadata = orjson.loads(values["metadata"])
    head = {name: value for name, value in values.items() if name not in _SERVED}
    head["id"], head["served_at"] = str(head["id"]), head["served_at"].isoformat()
    head["prompt_token_ids"] = unpack_ids(head["prompt_token_ids"])  # a list in the head's JSON
    return head, metadata


_PART_JSON_COLUMNS = ("head", "completion_token_ids", "completion_logprobs", "metadata")


def stream_parts_write(parts: list[Part]) -> set[int]:
    """Append the parts in one statement; the indices of those not written come back. If the
    statement fails, each part is written alone: one bad part never costs the others. A part written
    again (a retry after an answer lost on its way) replaces the one with its ``seq``."""
    now = timezone.now()
    rows: list[tuple[int, tuple]] = []
    failed: set[int] = set()
    for index, part in enumerate(parts):
        try:
            rows.append((index, _part_row(part, now)))
        except Exception:  # a value that is no JSON: this part only
            logger.exception("an open stream's part not written (its next write or its end makes it good)")
            failed.add(index)
    if not rows:
        return failed
    try:
        _insert([row for _, row in rows])
        return failed
    except DatabaseError as exc:
        if len(rows) == 1:
            logger.warning("an open stream's part not written (its next write or its end makes it good): %s", exc)
            return failed | {rows[0][0]}
    for index, row in rows:
        try:
            _insert([row])
        except DatabaseError as exc:
            failed.add(index)
            logger.warning("an open stream's part not written (its next write or its end makes it good): %s", exc)
    return failed


def _part_row(part: Part, now: datetime) -> tuple:
    return (
        part.tenant_id,
        part.interaction_id,
        part.seq,
        now,
        json_text(part.head),
        part.completion.replace("\x00", "\ufffd"),  # Postgres text cannot hold it (as served.py)
        json_text(part.completion_token_ids),
        json_text(part.completion_logprobs),
        json_text(part.metadata),
    )


def _insert(rows: list[tuple]) -> None:
    with transaction.atomic() if connection.in_atomic_block else nullcontext():  # a savepoint in a transaction
        if connection.vendor != "postgresql":
            StreamPart.objects.bulk_create(
                [StreamPart(**row_values(_PART_COLUMNS, row, _PART_JSON_COLUMNS)) for row in rows],
                update_conflicts=True,
                unique_fields=["tenant", "interaction_id", "seq"],
                update_fields=[name for name in _PART_COLUMNS[3:]],
            )
            return
        quote = connection.ops.quote_name
        columns = ", ".join(quote(c) for c in _PART_COLUMNS)
        values = values_sql(len(_PART_COLUMNS), len(rows))
        updates = ", ".join(f"{quote(c)} = excluded.{quote(c)}" for c in _PART_COLUMNS[3:])
        sql = (
            f"INSERT INTO {quote(StreamPart._meta.db_table)} ({columns}) VALUES {values} "
            f"ON CONFLICT (tenant_id, interaction_id, seq) DO UPDATE SET {updates}"
        )
        with prepared_cursor() as cursor:
            cursor.execute(sql, [v for row in rows for v in row])


def stream_parts_recorded(tenant: Tenant, rows: list[tuple]) -> None:
    """A stream that wrote parts ended: record its interactions (``rows``, served_rows') over any the
    sweeper recorded as partial meanwhile, delete its parts and attach the feedback that waited on
    it, in one transaction."""
    ids = [row[0] for row in rows]
    with transaction.atomic():
        # Its parts first: the sweeper locks them before the interaction too, so the two never deadlock.
        _parts_delete(tenant.pk, ids)
        interactions_upsert(rows)
        client_ids = [str(i) for i in ids]
        if "feedback" in pending_kinds(tenant, client_ids=client_ids):  # one plain probe, as ingest's
            feedback_attach_pending(tenant, client_ids=client_ids)


def _parts_delete(tenant_id: int, ids: Sequence[uuid.UUID]) -> None:
    """Delete the parts of the streams ``ids``: one plain statement on the stream's end (nothing
    refers to a part, so the ORM's delete would only compile the same statement, slower)."""
    if connection.vendor != "postgresql":
        StreamPart.objects.filter(tenant_id=tenant_id, interaction_id__in=list(ids)).delete()
        return
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {connection.ops.quote_name(StreamPart._meta.db_table)} "
            "WHERE tenant_id = %s AND interaction_id = ANY(%s)",
            [tenant_id, list(ids)],
        )


def stream_parts_discard(tenant: Tenant, *, ids: Sequence[uuid.UUID]) -> None:
    """Drop an open stream's parts: vLLM failed it, and a failed stream is recorded as a failure,
    never as half an interaction. Feedback that waits on it is kept (pending), never deleted."""
    _parts_delete(tenant.pk, ids)


def stream_parts_sweep(*, stale_s: float | None = None, now: datetime | None = None) -> int:
    """Record each stream whose parts were not written for ``stale_s`` (its worker died) as a partial
    interaction, one transaction each: one that fails is logged and the others go on; one that still
    fails ``SWEEP_GIVE_UP`` after its last write is dropped and recorded as a serving failure (the
    feedback on it stays pending, as on a stream vLLM failed). Returns how many were recorded."""
    stale_s = settings.STROP_SERVING_STALE_STREAM_S if stale_s is None else stale_s
    cutoff = (now or timezone.now()) - timedelta(seconds=stale_s)
    stale = (
        StreamPart.objects.values_list("tenant_id", "interaction_id")
        .annotate(last=Max("written_at"))
        .filter(last__lt=cutoff)
        .order_by("last")[:SWEEP_STREAMS]
    )
    give_up = (now or timezone.now()) - SWEEP_GIVE_UP
    recorded = 0
    for tenant_id, interaction_id, last in stale:
        try:
            recorded += _stream_close(tenant_id, interaction_id, cutoff=cutoff)
        except Exception:
            if last >= give_up:
                logger.exception("stale stream %s not recorded (the next sweep tries again)", interaction_id)
                continue
            logger.exception("stale stream %s not recorded since %s: its parts are dropped", interaction_id, last)
            _stream_given_up(tenant_id, interaction_id, last=last)
    return recorded


# A stream given up on, as its serving failure says it (``kind`` is an error code).
_GIVEN_UP_KIND = "server_error"


def _stream_given_up(tenant_id: int, interaction_id: uuid.UUID, *, last: datetime) -> None:
    """Drop a stale stream's parts, recording it as a serving failure that keeps its id, as one vLLM
    failed keeps it (``apps.serving.vllm_calls``): the feedback waiting on it stays pending, and an
    erase of the user finds it through the failure. Its first part says whose it was and what served
    it; without one (or if the failure cannot be written), the parts are dropped all the same."""
    try:
        with transaction.atomic():
            head = (
                StreamPart.objects.filter(tenant_id=tenant_id, interaction_id=interaction_id, seq=0)
                .values_list("head", flat=True)
                .first()
            )
            if isinstance(head, dict) and head.get("adapter_id") is not None:
                ServingFailure.objects.create(
                    tenant_id=tenant_id,
                    adapter_id=head["adapter_id"],
                    adapter_version_id=head.get("adapter_version_id"),
                    experiment_id=head.get("experiment_id"),
                    experiment_arm=head.get("experiment_arm") or "",
                    end_user_id=head.get("end_user_id") or "",
                    kind=_GIVEN_UP_KIND,
                    message="its worker died and what it had served could not be recorded",
                    streamed=True,
                    stream_ids=[str(interaction_id)],
                    occurred_at=last,
                )
            _parts_delete(tenant_id, [interaction_id])
        return
    except Exception:  # its adapter deleted meanwhile, say: the parts must go, or they stay first in every sweep
        logger.exception("stale stream %s: its serving failure not recorded", interaction_id)
    _parts_delete(tenant_id, [interaction_id])


def _stream_close(tenant_id: int, interaction_id: uuid.UUID, *, cutoff: datetime) -> int:
    with transaction.atomic():
        parts = list(
            StreamPart.objects.select_for_update()
            .filter(tenant_id=tenant_id, interaction_id=interaction_id)
            .order_by("seq")
        )
        if not parts or max(part.written_at for part in parts) >= cutoff:
            return 0  # its stream ended, or wrote again, since the sweep looked
        row = _partial_row(parts)
        if row is not None:
            interactions_bulk_insert([row])  # skipped if its stream's end recorded it meanwhile
        StreamPart.objects.filter(pk__in=[part.pk for part in parts]).delete()
        tenant = Tenant.objects.get(pk=tenant_id)
        feedback_attach_pending(tenant, client_ids=[str(interaction_id)])
        conversation_id = parts[0].head.get("conversation_id") if parts[0].head else None
        if conversation_id:  # a session outcome may have arrived before this turn (as apps.serving.chat)
            conversation_outcomes_apply(tenant, conversation_ids=[conversation_id], now=timezone.now())
    return int(row is not None)


def _partial_row(parts: list[StreamPart]) -> tuple | None:
    """The interaction row of what the parts hold: up to the first one missing."""
    if parts[0].seq != 0 or parts[0].head is None:
        logger.warning("stale stream %s has no first part: its parts are dropped", parts[0].interaction_id)
        return None
    text: list[str] = []
    token_ids: list[int] = []
    logprobs: list[float] = []
    metadata: dict[str, Any] = {}
    calls: dict[int, dict[str, Any]] = {}
    for expected, part in enumerate(parts):
        if part.seq != expected:
            break
        text.append(part.completion)
        token_ids.extend(part.completion_token_ids)
        logprobs.extend(part.completion_logprobs)
        part_metadata = dict(part.metadata)
        for delta in part_metadata.pop(TOOL_CALLS_SINCE, None) or []:
            empty = {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
            call = calls.setdefault(int(delta["index"]), empty)
            call["id"] = delta.get("id", call["id"])
            call["function"]["name"] = delta.get("name", call["function"]["name"])
            call["function"]["arguments"] += delta.get("arguments", "")
        metadata.update(part_metadata)
    if calls:  # as apps.interactions.served records a whole stream's
        metadata["tool_calls"] = [calls[index] for index in sorted(calls)]
    latency_ms = metadata.pop("latency_ms", None)
    metadata["partial"] = True  # what was served up to the last write before its worker died
    # A part's JSON wrote a -inf logprob as null: then none are kept, as for a count that differs.
    kept_logprobs = len(logprobs) == len(token_ids) and None not in logprobs
    served = {
        "completion": "".join(text),
        "completion_token_ids": pack_ids(token_ids),
        "completion_logprobs": pack_floats(logprobs if kept_logprobs else []),
        "latency_ms": latency_ms,
        "metadata": json_text(metadata),
        "received_at": timezone.now(),
    }
    head = parts[0].head
    values = {**head, **served, "served_at": datetime.fromisoformat(head["served_at"]), "id": uuid.UUID(head["id"])}
    prompt_ids = head["prompt_token_ids"]
    if isinstance(prompt_ids, str):  # a head written before the columns were packed: JSON text
        prompt_ids = unpack_ids(prompt_ids)
    values["prompt_token_ids"] = pack_ids(prompt_ids)
    return tuple(values[name] for name in INTERACTION_COLUMNS)
