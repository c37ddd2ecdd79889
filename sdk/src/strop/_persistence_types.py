"""The answer to a persistence report: the verdict on it, and what Strop measured."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strop._types import ItemResult


@dataclass
class PersistenceResult(ItemResult):
    """A persistence report's verdict: ``recorded`` (measured now: ``accepted_chars`` and, of them,
    ``retained_chars`` still there), ``pending`` (its interaction has not arrived; measured when it
    does) or ``rejected``."""

    checkpoint_s: int | None = None
    accepted_chars: int | None = None
    retained_chars: int | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PersistenceResult:
        base = ItemResult.from_json(data)
        return cls(
            index=base.index,
            status=base.status,
            id=base.id,
            client_id=base.client_id,
            error=base.error,
            checkpoint_s=data.get("checkpoint_s"),
            accepted_chars=data.get("accepted_chars"),
            retained_chars=data.get("retained_chars"),
        )
