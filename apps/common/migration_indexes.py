"""Index changes that must not stop a big table's writes: on Postgres an index is dropped or built
``CONCURRENTLY`` (so the migration that calls these is non-atomic), elsewhere (the embedded SQLite)
plainly. An interrupted concurrent build leaves an invalid index, which the next build drops first;
an interrupted drop is finished by running the migration again."""

from __future__ import annotations

from typing import Any


def _concurrently(schema_editor: Any) -> str:
    return " CONCURRENTLY" if schema_editor.connection.vendor == "postgresql" else ""


def index_drop_single_column(schema_editor: Any, *, table: str, column: str) -> None:
    """Drop the plain (not unique) index on ``column`` alone, found by its columns, not by the name
    Django gave it."""
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        constraints = connection.introspection.get_constraints(cursor, table)
        for name, constraint in constraints.items():
            if constraint["index"] and not constraint["unique"] and constraint["columns"] == [column]:
                cursor.execute(f"DROP INDEX{_concurrently(schema_editor)} IF EXISTS {connection.ops.quote_name(name)}")


def index_build(schema_editor: Any, *, name: str, on: str) -> None:
    """``CREATE INDEX name ON <on>`` (``on``: ``"table (columns)"``, or with ``USING``) unless a
    valid one of that name is there."""
    with schema_editor.connection.cursor() as cursor:
        if schema_editor.connection.vendor == "postgresql":
            cursor.execute(
                "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid WHERE c.relname = %s",
                [name],
            )
            row = cursor.fetchone()
            if row is not None and not row[0]:
                cursor.execute(f"DROP INDEX CONCURRENTLY IF EXISTS {name}")
        cursor.execute(f"CREATE INDEX{_concurrently(schema_editor)} IF NOT EXISTS {name} ON {on}")
