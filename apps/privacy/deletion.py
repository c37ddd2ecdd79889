"""Deleting many rows set-wise: what cascades from them goes one statement per table, children
first. No row is loaded but its key, where ``QuerySet.delete()`` reads every row (text and token
columns included) and deletes in chunks of a hundred: a month of a big tenant (retention) or a heavy
end user (an erase) is tens or hundreds of thousands. Strop's models have no delete signals, so
nothing is skipped.

Each table's rows are named by their keys, a chunk a statement: on Postgres a chunk is one array
literal joined as a set (``unnest``), where ``IN`` lists of thousands of placeholders, nested a level
per table, cost more than the deletes themselves; on SQLite (the embedded default) ``IN`` lists
within its limit on parameters. Children go before their parents: the rollup triggers of feedback
read its interaction's hour (``interactions.0010``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from django.db import connection
from django.db.models import CASCADE, DO_NOTHING, SET_NULL, Field, Model, QuerySet
from django.db.models.deletion import get_candidate_relations_to_delete

# Keys a statement: on SQLite within the 999 parameters its oldest builds allow; on Postgres few
# enough that the planner looks each up by index (at tens of thousands it may read the whole table).
CHUNK = {"postgresql": 2000, "sqlite": 900}


def rows_delete(rows: QuerySet[Any], *, keys: Sequence[Any] | None = None) -> Counter[str]:
    """Delete ``rows`` and what cascades from them (the models' own ``on_delete``); rows deleted by
    model label. A relation this cannot follow set-wise (``PROTECT``, ``SET_DEFAULT``, a callable,
    a foreign key to a field other than the primary key) stops it before anything is deleted from
    that table.

    The rows deleted are those ``rows`` named when this began (or, given ``keys``, those of them the
    caller read): one that arrives meanwhile (a request of the user served during their erase) stays,
    with what hangs off it, as one served just after would. On Postgres they go by their own filter
    as well as their keys (an end user's by the user's index, in the table's order, where key by key
    reads a page per row)."""
    model = rows.model
    keys = list(rows.values_list("pk", flat=True)) if keys is None else list(keys)
    if connection.vendor == "postgresql" and model._meta.pk.get_lookup("any") is not None:
        return _delete(model, keys, own=rows.filter(pk__any=keys))
    return _delete(model, keys)


def keys_delete(model: type[Model], keys: Sequence[Any]) -> Counter[str]:
    """:func:`rows_delete` for the rows of ``model`` whose primary keys are ``keys``."""
    return _delete(model, keys)


def _delete(model: type[Model], keys: Sequence[Any], *, own: QuerySet[Any] | None = None) -> Counter[str]:
    """The rows of ``model`` whose primary keys are ``keys``, after what cascades from them; by the
    ``own`` queryset instead of by key where given."""
    if not keys:
        return Counter()
    meta = model._meta
    chunks = _key_chunks(_pk(model), keys)
    counts = _children_delete(model, chunks)
    counts[meta.label] += (
        own._raw_delete(own.db) if own is not None else _run("delete", model, _pk_column(model), chunks)
    )
    return counts


def _children_delete(model: type[Model], chunks: list[tuple[str, list[Any]]]) -> Counter[str]:
    """What cascades from the rows of ``model`` whose primary keys are in ``chunks``."""
    counts: Counter[str] = Counter()
    meta = model._meta
    relations: list[Any] = list(get_candidate_relations_to_delete(meta))  # ForeignObjectRel
    for relation in relations:
        field, child = relation.field, relation.related_model
        if field.target_field != meta.pk:
            raise RuntimeError(f"cannot delete set-wise through {relation} (a key other than the primary key)")
        if relation.on_delete is CASCADE:
            rows = _run("select", child, field.column, chunks)
            counts += _delete(child, [row[0] for row in rows])
        elif relation.on_delete is SET_NULL:
            _run("set_null", child, field.column, chunks)
        elif relation.on_delete is not DO_NOTHING:
            raise RuntimeError(f"cannot delete set-wise through {relation} ({relation.on_delete.__name__})")
    return counts


# Postgres joins a chunk of keys as a set (``unnest`` of one array literal, which it parses faster
# than psycopg adapts each key): the planner looks each up by the column's index, where
# ``col = ANY(array)`` of thousands read the whole table.
_STATEMENTS = {
    "postgresql": {
        "select": "SELECT t.{pk} FROM {table} t JOIN unnest({keys}) AS k(v) ON t.{col} = k.v",
        "set_null": "UPDATE {table} t SET {col} = NULL FROM unnest({keys}) AS k(v) WHERE t.{col} = k.v",
        "delete": "DELETE FROM {table} t USING unnest({keys}) AS k(v) WHERE t.{col} = k.v",
    },
    "sqlite": {
        "select": "SELECT {pk} FROM {table} WHERE {col} IN ({keys})",
        "set_null": "UPDATE {table} SET {col} = NULL WHERE {col} IN ({keys})",
        "delete": "DELETE FROM {table} WHERE {col} IN ({keys})",
    },
}


def _pk(model: type[Model]) -> Field[Any, Any]:
    pk = model._meta.pk
    if pk is None:  # only an abstract model has none
        raise RuntimeError(f"{model._meta.label} has no primary key")
    return pk


def _pk_column(model: type[Model]) -> str:
    column = _pk(model).column
    if column is None:
        raise RuntimeError(f"{model._meta.label}'s primary key has no column")
    return column


def _key_chunks(pk: Field[Any, Any], keys: Sequence[Any]) -> list[tuple[str, list[Any]]]:
    """``keys`` (values of ``pk``) in chunks, each as its placeholders and parameters."""
    vendor = connection.vendor
    prepared = [pk.get_db_prep_value(key, connection) for key in keys]
    size = CHUNK.get(vendor, CHUNK["sqlite"])
    chunks = [prepared[start : start + size] for start in range(0, len(prepared), size)]
    if vendor == "postgresql":
        kind = pk.rel_db_type(connection)
        return [(f"%s::{kind}[]", ["{" + ",".join(map(_element, chunk)) + "}"]) for chunk in chunks]
    return [(", ".join(["%s"] * len(chunk)), chunk) for chunk in chunks]


def _element(key: Any) -> str:
    """A key as an element of a Postgres array literal: quoted, so any text is one element."""
    return '"' + str(key).replace("\\", "\\\\").replace('"', '\\"') + '"'


def _run(kind: str, model: type[Model], column: str, chunks: list[tuple[str, list[Any]]]) -> Any:
    """One of the statements above on ``model``'s rows whose ``column`` is one of the keys, a
    statement a chunk: the rows a ``select`` returns, or how many rows the others changed."""
    quote = connection.ops.quote_name
    names = {"table": quote(model._meta.db_table), "col": quote(column), "pk": quote(_pk_column(model))}
    statement = _STATEMENTS.get(connection.vendor, _STATEMENTS["sqlite"])[kind]
    rows: list[Any] = []
    changed = 0
    with connection.cursor() as cursor:
        for placeholders, params in chunks:
            cursor.execute(statement.format(**names, keys=placeholders), params)
            if kind == "select":
                rows.extend(cursor.fetchall())
            else:
                changed += cursor.rowcount
    return rows if kind == "select" else changed
