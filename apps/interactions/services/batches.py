"""What every ingest batch shares: its size limit and the verdict on each item."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings

from apps.common.exceptions import PayloadTooLarge
from apps.interactions.rollups import rollups_settled_before
from apps.tenants.models import Tenant


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


# A retention cutoff is a day back at least (``retention_days`` is 1 or more), and so is every hour
# retention has settled: a batch served (or labelled) within the last day asks nothing.
_SETTLED_AT_LEAST = timedelta(days=1)


def settled_before(
    tenant: Tenant, moments: Iterable[datetime | None], *, now: datetime, hold: bool = False
) -> datetime | None:
    """``apps.interactions.rollups.rollups_settled_before`` when one of ``moments`` may be before it
    (one query then); None when none can."""
    recent = now - _SETTLED_AT_LEAST
    if not any(moment is not None and moment < recent for moment in moments):
        return None
    return rollups_settled_before(tenant.pk, hold=hold)


def served_before_settled_error(served_at: datetime, settled: datetime) -> dict[str, str]:
    """The verdict of an interaction served in an hour retention has settled."""
    return {
        "code": "invalid",
        "message": f"served_at: {served_at.isoformat()} is before {settled.isoformat()}, up to which this "
        "tenant's retention has deleted interactions and counted them in its charts for good; one served "
        "then is not stored (retention would delete it at once, and count it twice if it was stored before)",
        "field": "served_at",
    }


def label_before_settled_error(field: str, value: str, occurred_at: datetime, settled: datetime) -> dict[str, str]:
    """The verdict of a label, for no stored interaction, on something that happened in an hour
    retention has settled: its interaction is deleted, or would not be stored now, so it would wait
    as pending for nothing."""
    return {
        "code": "unknown_interaction",
        "message": f"{field}: no interaction {value[:200]!r}, and occurred_at ({occurred_at.isoformat()}) is "
        f"before {settled.isoformat()}, up to which this tenant's retention has deleted interactions: its "
        "interaction is gone (or would not be stored), so the label is not kept",
        "field": field,
    }
