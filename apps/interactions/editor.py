"""The autocomplete outcome an editor plugin (Continue's ``AutocompleteOutcome``) reports.

Mapped onto one interaction (idempotent on ``completionId``) plus, when ``accepted`` is present,
its feedback. Fields we do not model (the plugin's options, ``numLines``, ``filepath``…) are kept
in the interaction's metadata.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db import transaction

from apps.interactions.models import Interaction
from apps.interactions.services import ItemResult, feedback_ingest, interactions_ingest
from apps.interactions.validation import ItemError
from apps.tenants.models import Tenant

_MAPPED = {
    "completionId",
    "prefix",
    "suffix",
    "prompt",
    "completion",
    "modelName",
    "uniqueId",
    "time",
    "accepted",
    "timestamp",
}


def _timestamp(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ItemError("timestamp", "must be an ISO 8601 string or milliseconds since the epoch")
    if isinstance(value, str):
        return value
    try:
        return datetime.fromtimestamp(value / 1000, tz=UTC).isoformat()
    except (OverflowError, OSError, ValueError):
        raise ItemError(
            "timestamp", f"{value!r} milliseconds since the epoch is not a date from year 1 to 9999"
        ) from None


def editor_outcome_ingest(tenant: Tenant, *, payload: Any) -> tuple[ItemResult, ItemResult | None]:
    if not isinstance(payload, dict):
        raise ItemError("body", "must be a JSON object (an autocomplete outcome)")
    accepted = payload.get("accepted")
    if accepted is not None and not isinstance(accepted, bool):
        raise ItemError("accepted", "must be true, false or absent")
    latency = payload.get("time")
    interaction = {
        "client_id": payload.get("completionId"),
        "prompt": payload.get("prompt"),
        "prefix": payload.get("prefix"),
        "suffix": payload.get("suffix"),
        "completion": payload.get("completion"),
        "model": payload.get("modelName"),
        "end_user_id": payload.get("uniqueId"),
        "served_at": _timestamp(payload.get("timestamp")),
        "latency_ms": latency,
        "metadata": {key: value for key, value in payload.items() if key not in _MAPPED},
    }
    interaction = {key: value for key, value in interaction.items() if value is not None}
    with transaction.atomic():
        (stored,) = interactions_ingest(tenant, items=[interaction], source=Interaction.Source.EDITOR)
        if stored.status == "rejected" or accepted is None:
            return stored, None
        (feedback,) = feedback_ingest(
            tenant, items=[{"client_id": stored.client_id, "outcome": "accepted" if accepted else "rejected"}]
        )
    return stored, feedback
