"""Interaction rows as the writers take them: one tuple per row, in ``INTERACTION_COLUMNS`` order,
JSON columns as text, token ids and logprobs packed (``apps.interactions.packed``). ``COPY`` for
batches, one plain ``INSERT`` for what the completion endpoint serves, a bulk insert of model
instances where the database is not Postgres (the upsert of a stream's last write merging the
stored metadata there as Postgres does). And the statement that upserts feedback rows
(``feedback_upsert_sql``), and the lock a label takes on the interactions it names
(``interactions_held``)."""

from __future__ import annotations

import functools
import uuid
from collections.abc import Collection, Sequence
from typing import Any

import orjson
from django.db import connection, transaction

from apps.common.lookups import prepared_cursor
from apps.interactions.models import Feedback, Interaction


def json_text(value: Any) -> str | None:
    return None if value is None else orjson.dumps(value).decode()


INTERACTION_COLUMNS = (
    "id",
    "tenant_id",
    "client_id",
    "source",
    "prompt",
    "prefix",
    "suffix",
    "completion",
    "prompt_token_ids",
    "completion_token_ids",
    "completion_logprobs",
    "model_name",
    "adapter_id",
    "adapter_version_id",
    "experiment_id",
    "experiment_arm",
    "end_user_id",
    "end_user_opted_in",
    "served_at",
    "received_at",
    "latency_ms",
    "metadata",
    "messages",
    "tools",
    "conversation_id",
    "turn",
)
_JSON_COLUMNS = ("metadata", "messages", "tools")  # token ids and logprobs come packed (``packed``)


def values_sql(width: int, count: int) -> str:
    """The ``VALUES`` list of ``count`` rows of ``width`` placeholders: ``(%s, %s), (%s, %s)``."""
    return ", ".join(["(" + ", ".join(["%s"] * width) + ")"] * count)


def row_values(columns: Sequence[str], row: tuple, json_columns: Sequence[str]) -> dict[str, Any]:
    """A row made for the raw ``INSERT`` as model field values (its JSON text columns parsed back),
    for the ORM path taken where the database is not Postgres."""
    values = dict(zip(columns, row, strict=True))
    for name in json_columns:
        values[name] = orjson.loads(values[name]) if values[name] is not None else None
    return values


def _table_and_columns() -> tuple[str, str]:
    quote = connection.ops.quote_name
    return quote(Interaction._meta.db_table), ", ".join(quote(c) for c in INTERACTION_COLUMNS)


def interactions_copy(rows: list[tuple]) -> None:
    """``COPY`` the rows (Postgres): a batch in one stream. A client id already stored raises
    Django's ``IntegrityError``, as any statement does (the raw cursor's own errors are translated)."""
    table, columns = _table_and_columns()
    with connection.cursor() as cursor, connection.wrap_database_errors:
        with cursor.cursor.copy(f"COPY {table} ({columns}) FROM STDIN") as copy:
            for row in rows:
                copy.write_row(row)


def interactions_insert(rows: list[tuple]) -> None:
    """One plain ``INSERT`` of a few rows (no ORM compile), autocommitted outside a transaction;
    a bulk insert where the database is not Postgres."""
    if connection.vendor != "postgresql":
        interactions_bulk_insert(rows)
        return
    table, columns = _table_and_columns()
    values = values_sql(len(INTERACTION_COLUMNS), len(rows))
    with prepared_cursor() as cursor:
        cursor.execute(f"INSERT INTO {table} ({columns}) VALUES {values}", [v for row in rows for v in row])


# What a stream's last write brings up to date when its interaction is already there (the sweeper
# recorded it as partial while the stream was stalled: ``apps.interactions.stream_parts``). The
# request, its route and when it was served stay; the metadata is merged, never replaced.
_SERVED_COLUMNS = ("completion", "completion_token_ids", "completion_logprobs", "latency_ms")


def interactions_upsert(rows: list[tuple]) -> None:
    """Insert the rows; one whose id is there (for the same tenant) gets what was served and its
    metadata merged over the stored one (``"partial"`` dropped): a stream's last write."""
    if connection.vendor != "postgresql":
        _interactions_upsert_merged(rows)
        return
    table, columns = _table_and_columns()
    quote = connection.ops.quote_name
    values = values_sql(len(INTERACTION_COLUMNS), len(rows))
    updates = ", ".join(f"{quote(c)} = excluded.{quote(c)}" for c in _SERVED_COLUMNS)
    merged = f"{quote('metadata')} = ({table}.{quote('metadata')} - 'partial') || excluded.{quote('metadata')}"
    sql = (
        f"INSERT INTO {table} ({columns}) VALUES {values} ON CONFLICT ({quote('id')}) DO UPDATE SET {updates}, "
        f"{merged} WHERE {table}.{quote('tenant_id')} = excluded.{quote('tenant_id')}"
    )
    with prepared_cursor() as cursor:
        cursor.execute(sql, [v for row in rows for v in row])


def _interactions_upsert_merged(rows: list[tuple]) -> None:
    """:func:`interactions_upsert` where the database is not Postgres: the stored metadata read and
    merged here, under the write lock that SQLite's IMMEDIATE transaction holds from its start, as
    Postgres's ``||`` merges it (one level; a key set to null stays, as null). SQLite's
    ``json_patch()`` would delete such a key and merge nested objects instead of replacing them."""
    values = [row_values(INTERACTION_COLUMNS, row, _JSON_COLUMNS) for row in rows]
    with transaction.atomic():
        ids = [value["id"] for value in values]
        stored = {
            str(pk): (tenant_id, metadata)
            for pk, tenant_id, metadata in Interaction.objects.filter(pk__in=ids).values_list(
                "id", "tenant_id", "metadata"
            )
        }
        objects = []
        for value in values:
            if str(value["id"]) in stored:
                tenant_id, metadata = stored[str(value["id"])]
                if tenant_id != value["tenant_id"]:
                    continue  # another tenant's id: left as it is, as Postgres's WHERE leaves it
                kept = {key: item for key, item in (metadata or {}).items() if key != "partial"}
                value["metadata"] = {**kept, **(value["metadata"] or {})}
            objects.append(Interaction(**value))
        Interaction.objects.bulk_create(
            objects, update_conflicts=True, unique_fields=["id"], update_fields=[*_SERVED_COLUMNS, "metadata"]
        )


def interactions_bulk_insert(rows: list[tuple]) -> None:
    """The rows as model instances, in one bulk insert; rows whose client id exists are skipped."""
    objects = [Interaction(**row_values(INTERACTION_COLUMNS, row, _JSON_COLUMNS)) for row in rows]
    Interaction.objects.bulk_create(objects, ignore_conflicts=True)


# Last write wins by the time the user acted; a turn's own feedback always replaces a session outcome
# spread to it (apps.interactions.sessions). Every event is counted in events_received.
_FEEDBACK_COLUMNS = """INSERT INTO {table} (tenant_id, interaction_id, pending_client_id, outcome, kept_text,
    accepted_chars, occurred_at, received_at, updated_at, events_received, metadata, reward_weight,
    session_outcome_id)"""
_FEEDBACK_ON_CONFLICT = """ON CONFLICT (tenant_id, {target}) WHERE {target} IS NOT NULL DO UPDATE SET
    outcome = CASE WHEN {newer} THEN excluded.outcome ELSE {table}.outcome END,
    kept_text = CASE WHEN {newer} THEN excluded.kept_text ELSE {table}.kept_text END,
    accepted_chars = CASE WHEN {newer} THEN excluded.accepted_chars ELSE {table}.accepted_chars END,
    metadata = CASE WHEN {newer} THEN excluded.metadata ELSE {table}.metadata END,
    reward_weight = CASE WHEN {newer} THEN 1.0 ELSE {table}.reward_weight END,
    occurred_at = CASE WHEN {newer} THEN excluded.occurred_at ELSE {table}.occurred_at END,
    session_outcome_id = CASE WHEN {newer} THEN NULL ELSE {table}.session_outcome_id END,
    updated_at = excluded.updated_at,
    events_received = {table}.events_received + excluded.events_received"""
_NEWER = "(excluded.occurred_at >= {table}.occurred_at OR {table}.session_outcome_id IS NOT NULL)"
# One item naming an interaction that exists: find it and upsert its feedback in one statement,
# one round trip instead of a lookup and then the write. No row back: the interaction is not
# there (yet), and the general path decides (404, pending or rejected). Never a partial accept (its
# accepted_chars is checked against the completion first), so accepted_chars is NULL. The interaction
# is locked as interactions_held locks it: one being deleted is waited for, and then not found.
_FEEDBACK_FROM_INTERACTION = """SELECT %s, i.id, NULL, %s, %s, NULL, %s, %s, %s, 1, %s::jsonb, 1.0, NULL
FROM {interactions} i WHERE {tenant} = %s AND i.{key} = %s FOR KEY SHARE OF i"""
# The statement is prepared, and the plan Postgres keeps may be made on a nearly empty table, where
# an index on the tenant alone costs the same as the right one; that plan filters every interaction
# of the tenant until it is made again. By id, the tenant is compared as ``tenant_id + 0``, which no
# index serves, so the primary key finds the row. By client id every candidate index starts with
# the tenant, and such a tie cannot be ruled out by the statement (see the README's Ingestion).
_TENANT_OF_KEY = {"id": "i.tenant_id + 0", "client_id": "i.tenant_id"}


@functools.cache
def feedback_upsert_sql(target: str, key: str | None = None) -> str:
    """The feedback upsert on ``target`` (interaction_id or pending_client_id), built once: from
    VALUES (``accepted_chars`` the parameter after ``kept_text``), or with ``key`` (id or
    client_id) from the interaction it names, returning its id."""
    table = connection.ops.quote_name(Feedback._meta.db_table)
    clause = _FEEDBACK_ON_CONFLICT.format(table=table, target=target, newer=_NEWER.format(table=table))
    if key is None:
        values = "VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, 1.0, NULL)"
        return f"{_FEEDBACK_COLUMNS.format(table=table)}\n{values}\n{clause}"
    rows = _FEEDBACK_FROM_INTERACTION.format(
        interactions=connection.ops.quote_name(Interaction._meta.db_table), key=key, tenant=_TENANT_OF_KEY[key]
    )
    return f"{_FEEDBACK_COLUMNS.format(table=table)}\n{rows}\n{clause}\nRETURNING interaction_id"


def interactions_held(tenant_id: int, ids: Collection[uuid.UUID]) -> set[uuid.UUID]:
    """Which of ``ids`` are the tenant's interactions now, each locked ``FOR KEY SHARE`` until the
    transaction ends (Postgres; read plainly elsewhere, where writers go one at a time). No query for
    no ids.

    A label (feedback, a persistence report, a session outcome's spread) takes it on the interactions
    it names before it writes: one that retention or an erase is deleting is waited for and then not
    returned (the label is answered as for an interaction that is gone), and one locked first is not
    deleted before the label commits (both lock what they delete first, and so find the label then and
    delete it with the rest). Without it, the label's row met its deleted interaction only at commit
    (foreign keys are checked there) and the whole batch failed. In key order, as those deletes take
    them, so the two never deadlock."""
    if not ids:
        return set()
    table = connection.ops.quote_name(Interaction._meta.db_table)
    prepared = [Interaction._meta.pk.get_db_prep_value(i, connection) for i in ids]
    params: list[Any]
    if connection.vendor == "postgresql":
        where, params, lock = "id = ANY(%s)", [tenant_id, prepared], " ORDER BY id FOR KEY SHARE"
    else:
        where, params, lock = f"id IN ({', '.join(['%s'] * len(prepared))})", [tenant_id, *prepared], ""
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id FROM {table} WHERE tenant_id = %s AND {where}{lock}", params)
        rows = cursor.fetchall()
    return {row[0] if isinstance(row[0], uuid.UUID) else uuid.UUID(str(row[0])) for row in rows}
