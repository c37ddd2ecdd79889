"""``field__any=[...]``: ``field = ANY(%s)`` with one array parameter on Postgres.

A 1000-value ``__in`` compiles 1000 placeholders on every call, which costs more than the query
on the ingest hot path. Use :func:`in_values` to get the right lookup for the database in use.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from django.db import connection
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper
from django.db.models import CharField, Lookup, Model, UUIDField


class AnyLookup(Lookup):
    lookup_name = "any"
    prepare_rhs = False

    def get_db_prep_lookup(self, value: Any, connection: Any) -> tuple[str, Any]:
        return "%s", [list(value)]

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, Any]:
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        return f"{lhs} = ANY({rhs})", [*lhs_params, *rhs_params]


CharField.register_lookup(AnyLookup)
UUIDField.register_lookup(AnyLookup)


def in_values(field: str, values: Iterable[Any]) -> dict[str, list[Any]]:
    """Filter kwargs matching ``field`` against many values, as cheaply as the database allows."""
    lookup = "any" if connection.vendor == "postgresql" else "in"
    return {f"{field}__{lookup}": list(values)}


def tenant_rows(
    model: type[Model], tenant_id: int, *, key: str, values: Iterable[Any], columns: Sequence[str]
) -> list[tuple[Any, ...]]:
    """``columns`` of ``model``'s rows of one tenant whose ``key`` is one of ``values``, in one
    plain query, each value as its field's Python type.

    The ingest and serving hot paths ask this on every request; the ORM spends more compiling it
    than the database answering."""
    key_field: Any = model._meta.get_field(key)  # a concrete field: its column and conversions
    wanted = [key_field.get_db_prep_value(value, connection) for value in values]
    if not wanted:
        return []
    quote = connection.ops.quote_name
    params: list[Any]
    if connection.vendor == "postgresql":
        where, params = f"{quote(key)} = ANY(%s)", [tenant_id, wanted]
    else:
        where, params = f"{quote(key)} IN ({', '.join(['%s'] * len(wanted))})", [tenant_id, *wanted]
    fields: list[Any] = [model._meta.get_field(name) for name in columns]
    # Planned on every call, never prepared: Postgres would keep the generic plan it chose while the
    # table was small (every row of the tenant, filtered against the array), and the table grows.
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {', '.join(quote(f.column) for f in fields)} FROM {quote(model._meta.db_table)} "
            f"WHERE tenant_id = %s AND {where}",
            params,
        )
        rows = cursor.fetchall()
    return [tuple(f.to_python(v) for f, v in zip(fields, row, strict=True)) for row in rows]


def ids_by_client_id(model: type[Model], tenant_id: int, client_ids: Iterable[str]) -> dict[str, Any]:
    """``{client_id: id}`` of ``model``'s rows of one tenant."""
    return dict(tenant_rows(model, tenant_id, key="client_id", values=client_ids, columns=("client_id", "id")))


@functools.cache
def _row_reader(model: type[Model], vendor: str) -> tuple[list[str], tuple[tuple[Any, tuple[Any, ...]], ...]]:
    """The attribute names of ``model``'s concrete fields, and each one's column with its converters."""
    fields = model._meta.concrete_fields
    converters = []
    for field in fields:
        expression = field.get_col(model._meta.db_table)
        converters.append(
            (expression, (*connection.ops.get_db_converters(expression), *field.get_db_converters(connection)))
        )
    return [f.attname for f in fields], tuple(converters)


def model_from_row(model: type[Model], values: Sequence[Any]) -> Any:
    """An instance of ``model`` from a plain query's row of all its concrete columns, in field
    order, converted as the ORM would (JSON, and sqlite's dates and booleans)."""
    attnames, converters = _row_reader(model, connection.vendor)
    converted = []
    for (expression, convert_all), value in zip(converters, values, strict=True):
        if value is not None:
            for convert in convert_all:
                value = convert(value, expression, connection)
        converted.append(value)
    return model.from_db(connection.alias, attnames, converted)


def model_columns(model: type[Model], alias: str) -> str:
    """``alias.col, …`` for every concrete column of ``model``, in the order model_from_row takes."""
    return _model_columns(model, alias, connection.vendor)


@functools.cache
def _model_columns(model: type[Model], alias: str, vendor: str) -> str:
    return ", ".join(f"{alias}.{connection.ops.quote_name(_column(f))}" for f in model._meta.concrete_fields)


def _column(field: Any) -> str:
    column = field.column
    if column is None:  # a concrete field always has one
        raise RuntimeError(f"{field} has no column")
    return str(column)


# One statement to read: (sql, params, the models whose columns it selects in turn).
Read = tuple[str, Sequence[Any], Sequence[type[Model]]]


def joined_row(sql: str, params: Sequence[Any], models: Sequence[type[Model]]) -> list[Any] | None:
    """The first row of ``sql`` (selecting every column of each of ``models`` in turn, see
    model_columns) as one instance per model; None for a model whose columns are all NULL (an
    outer join that found nothing). None when there is no row.

    For lookups on every request (authentication, routing), where the ORM spends more time
    compiling a query with joins than Postgres spends answering it."""
    return joined_rows([(sql, params, models)])[0]


def joined_rows(reads: Sequence[Read]) -> list[list[Any] | None]:
    """``joined_row`` of each (sql, params, models), in one round trip on Postgres (the statements
    pipelined, each prepared on the connection: see prepared_cursor), one after the other
    elsewhere. On a request path the wait for each answer costs more than the small queries; one
    statement joining them all costs the planner more."""
    if len(reads) > 1 and connection.vendor == "postgresql":
        rows = _pipelined(reads)
    else:
        rows = []
        with prepared_cursor() as cursor:
            for sql, params, _ in reads:
                cursor.execute(sql, params)
                rows.append(cursor.fetchone())
    return [None if row is None else _instances(row, models) for row, (_, _, models) in zip(rows, reads, strict=True)]


def _pipelined(reads: Sequence[Read]) -> list[Any]:
    """The first row of each read, the statements sent together in psycopg's pipeline mode (one
    cursor each: a cursor holds one result). Django's query log gets one entry for the trip."""
    raw = _connected()
    started = time.monotonic()
    cursors = [psycopg.Cursor(raw) for _ in reads]
    try:
        with connection.wrap_database_errors:
            with raw.pipeline():
                for cursor, (sql, params, _) in zip(cursors, reads, strict=True):
                    cursor.execute(sql, params)
            rows = [cursor.fetchone() for cursor in cursors]
    finally:
        for cursor in cursors:
            cursor.close()
    if connection.queries_logged:
        ops: Any = connection.ops  # Postgres' operations (compose_sql)
        sql = "; ".join(ops.compose_sql(sql, params) for sql, params, _ in reads)
        connection.queries_log.append({"sql": sql, "time": f"{time.monotonic() - started:.3f}"})
    return rows


class _ServerCursorDebugWrapper(CursorDebugWrapper):
    """Django's query log for a cursor that binds on the server: the statement with its
    parameters as text (Django reads it back from the cursor only when it binds on the client)."""

    def debug_sql(self, sql: Any = None, params: Any = None, use_last_executed_query: bool = False, many: bool = False):
        if use_last_executed_query and sql is not None:
            ops: Any = connection.ops  # Postgres' operations (compose_sql)
            sql = ops.compose_sql(sql, params)
        return super().debug_sql(sql, params, use_last_executed_query=False, many=many)


@contextmanager
def prepared_cursor() -> Iterator[Any]:
    """A cursor for the hot paths' plain statements (authentication, routing, the served record,
    single feedback). On Postgres it binds parameters on the server, so psycopg prepares each
    statement on its connection at its second use (``prepare_threshold`` in the settings) and
    Postgres stops planning it on every request: planning the serving lookup's three statements
    cost more than running them. Statements and parameters are as for ``connection.cursor()``
    (``%s`` placeholders), errors are Django's and its query log sees them. Elsewhere it is
    ``connection.cursor()``.

    Postgres types each parameter from the statement: a bare ``%s`` whose type the statement does
    not say (in a SELECT list feeding a jsonb column, say) needs a cast."""
    if connection.vendor != "postgresql":
        with connection.cursor() as cursor:
            yield cursor
        return
    # Django's default cursor binds on the client, and psycopg never prepares those.
    wrapper = _ServerCursorDebugWrapper if connection.queries_logged else CursorWrapper
    with wrapper(psycopg.Cursor(_connected()), connection) as cursor:
        yield cursor


def _connected() -> psycopg.Connection:
    """The psycopg connection under Django's, after the checks ``connection.cursor()`` makes
    before it opens a cursor (a failed health check reconnects; one thread per connection)."""
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    connection.validate_thread_sharing()
    return connection.connection


def _instances(row: Sequence[Any], models: Sequence[type[Model]]) -> list[Any]:
    instances, offset = [], 0
    for model in models:
        width = len(model._meta.concrete_fields)
        values = row[offset : offset + width]
        offset += width
        instances.append(None if all(v is None for v in values) else model_from_row(model, values))
    return instances
