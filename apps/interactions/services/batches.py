"""What every ingest batch shares: its size limit and the verdict on each item."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.conf import settings

from apps.common.exceptions import PayloadTooLarge


@dataclass
class ItemResult:
    """The verdict on one item of a batch."""

    index: int
    status: str
    id: str | None = None
    client_id: str | None = None
    error: dict[str, str] | None = None
    conversation_id: str | None = None  # a session outcome

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "status": self.status}
        if self.id is not None:
            out["id"] = self.id
        if self.client_id is not None:
            out["client_id"] = self.client_id
        if self.conversation_id is not None:
            out["conversation_id"] = self.conversation_id
        if self.error is not None:
            out["error"] = self.error
        return out


def batch_check_size(items: Sequence[Any]) -> None:
    limit = settings.STROP_MAX_BATCH_ITEMS
    if len(items) > limit:
        raise PayloadTooLarge(
            f"items: a batch holds at most {limit} items, this one has {len(items)}; split it",
            details={"limit_items": limit, "items": len(items)},
        )
