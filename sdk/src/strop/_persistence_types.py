"""The answer to a persistence report (the verdict on it, and what Strop measured), and an
interaction's retained characters by checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from strop._types import ItemResult, parse_datetime


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


@dataclass
class PersistenceCheckpoint:
    """What was left of an accepted completion at one checkpoint after the accept."""

    checkpoint_s: int
    accepted_chars: int | None
    retained_chars: int | None
    retained_share: float | None
    """retained ÷ accepted characters (None: nothing accepted)."""
    reported_ratio: float | None
    """The share the client measured, when it sent one instead of the text."""
    occurred_at: datetime | None
    updated_at: datetime | None
    events_received: int

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PersistenceCheckpoint:
        return cls(
            checkpoint_s=data["checkpoint_s"],
            accepted_chars=data.get("accepted_chars"),
            retained_chars=data.get("retained_chars"),
            retained_share=data.get("retained_share"),
            reported_ratio=data.get("reported_ratio"),
            occurred_at=parse_datetime(data.get("occurred_at")),
            updated_at=parse_datetime(data.get("updated_at")),
            events_received=data.get("events_received", 1),
        )


@dataclass
class InteractionPersistence:
    """An interaction's retained characters: at its latest checkpoint, and every checkpoint
    reported so far, earliest first (empty before any report)."""

    interaction_id: str
    accepted_chars: int | None
    retained_chars: int | None
    latest_checkpoint_s: int | None
    reports: list[PersistenceCheckpoint]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InteractionPersistence:
        return cls(
            interaction_id=str(data["interaction_id"]),
            accepted_chars=data.get("accepted_chars"),
            retained_chars=data.get("retained_chars"),
            latest_checkpoint_s=data.get("latest_checkpoint_s"),
            reports=[PersistenceCheckpoint.from_json(r) for r in data.get("reports") or []],
        )
