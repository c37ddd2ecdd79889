"""``field__any=[...]``: ``field = ANY(%s)`` with one array parameter on Postgres.

A 1000-value ``__in`` compiles 1000 placeholders on every call, which costs more than the query
on the ingest hot path. Use :func:`in_values` to get the right lookup for the database in use.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.db import connection
from django.db.models import CharField, Lookup, UUIDField


class AnyLookup(Lookup):
    lookup_name = "any"
    prepare_rhs = False

    def get_db_prep_lookup(self, value: Any, connection: Any) -> tuple[str, list[Any]]:
        return "%s", [list(value)]

    def as_sql(self, compiler: Any, connection: Any) -> tuple[str, list[Any]]:
        lhs, lhs_params = self.process_lhs(compiler, connection)
        rhs, rhs_params = self.process_rhs(compiler, connection)
        return f"{lhs} = ANY({rhs})", [*lhs_params, *rhs_params]


CharField.register_lookup(AnyLookup)
UUIDField.register_lookup(AnyLookup)


def in_values(field: str, values: Iterable[Any]) -> dict[str, list[Any]]:
    """Filter kwargs matching ``field`` against many values, as cheaply as the database allows."""
    lookup = "any" if connection.vendor == "postgresql" else "in"
    return {f"{field}__{lookup}": list(values)}
