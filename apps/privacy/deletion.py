"""Deleting many rows set-wise: what cascades from them goes one statement per table, children
first, each naming its parents by a subquery. No row is loaded, where ``QuerySet.delete()`` reads
every row (text and token columns included) and deletes in chunks of a hundred: a month of a big
tenant (retention) or a heavy end user (an erase) is tens or hundreds of thousands. Strop's models
have no delete signals, so nothing is skipped."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.db.models import CASCADE, DO_NOTHING, SET_NULL, QuerySet
from django.db.models.deletion import get_candidate_relations_to_delete


def rows_delete(rows: QuerySet[Any]) -> Counter[str]:
    """Delete ``rows`` and what cascades from them (the models' own ``on_delete``); rows deleted by
    model label. A relation this cannot follow set-wise (``PROTECT``, ``SET_DEFAULT``, a callable)
    stops it before anything is deleted from that table."""
    counts: Counter[str] = Counter()
    for relation in get_candidate_relations_to_delete(rows.model._meta):
        children = relation.related_model._base_manager.filter(**{f"{relation.field.name}__in": rows.values("pk")})
        if relation.on_delete is CASCADE:
            counts += rows_delete(children)
        elif relation.on_delete is SET_NULL:
            children.update(**{relation.field.name: None})
        elif relation.on_delete is not DO_NOTHING:
            raise RuntimeError(f"cannot delete set-wise through {relation} ({relation.on_delete.__name__})")
    counts[rows.model._meta.label] += rows._raw_delete(rows.db)
    return counts
