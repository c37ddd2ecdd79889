"""Interaction rows as the writers take them: one tuple per row, in ``INTERACTION_COLUMNS`` order,
JSON columns as text. ``COPY`` for batches, one plain ``INSERT`` for what the completion endpoint
serves, a bulk insert of model instances where the database is not Postgres."""

from __future__ import annotations

from typing import Any

import orjson
from django.db import connection

from apps.interactions.models import Interaction


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
_JSON_COLUMNS = ("prompt_token_ids", "completion_token_ids", "completion_logprobs", "metadata", "messages", "tools")


def _table_and_columns() -> tuple[str, str]:
    quote = connection.ops.quote_name
    return quote(Interaction._meta.db_table), ", ".join(quote(c) for c in INTERACTION_COLUMNS)


def interactions_copy(rows: list[tuple]) -> None:
    """``COPY`` the rows (Postgres): a batch in one stream."""
    table, columns = _table_and_columns()
    with connection.cursor() as cursor:
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
    values = ", ".join(["(" + ", ".join(["%s"] * len(INTERACTION_COLUMNS)) + ")"] * len(rows))
    with connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {table} ({columns}) VALUES {values}", [v for row in rows for v in row])


def interactions_bulk_insert(rows: list[tuple]) -> None:
    """The rows as model instances, in one bulk insert; rows whose client id exists are skipped."""
    objects = []
    for row in rows:
        values = dict(zip(INTERACTION_COLUMNS, row, strict=True))
        for name in _JSON_COLUMNS:
            values[name] = orjson.loads(values[name]) if values[name] is not None else None
        objects.append(Interaction(**values))
    Interaction.objects.bulk_create(objects, ignore_conflicts=True)
