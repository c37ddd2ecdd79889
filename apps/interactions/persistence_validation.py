"""Fast validation of persistence reports (what is left of an accepted completion at a checkpoint),
with the field checks of ``apps.common.item_checks``, as ``validation.py`` does for feedback. The fields
are the ones ``contract.py`` declares (and the OpenAPI schema publishes)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from apps.common.item_checks import (
    ItemError,
    item_datetime,
    item_id,
    item_metadata,
    item_number,
    item_text,
    reject_unknown_fields,
)
from apps.common.parsing import is_uuid
from apps.interactions.contract import MAX_CHECKPOINT_S, PersistenceReportInSchema, fields_of
from apps.interactions.retention import MAX_REPORTED_TEXT
from apps.interactions.validation import MAX_ACCEPTED_CHARS

PERSISTENCE_FIELDS = fields_of(PersistenceReportInSchema)


@dataclass
class PersistenceIn:
    interaction_id: uuid.UUID | None
    client_id: str | None
    checkpoint_s: int
    text: str | None  # the text now at the insertion point (or the document)
    retained_ratio: float | None  # or the share the client measured
    accepted_chars: int | None  # a partial accept: the leading characters taken; None: the whole completion
    occurred_at: datetime | None
    metadata: dict[str, Any] = field(default_factory=dict)
    conversation_id: str | None = None  # never set: a report names one completion, not a session


def accepted_chars_too_long(value: int, completion_length: int) -> ItemError:
    """``accepted_chars`` is longer than the completion it names (checked where the completion is known)."""
    return ItemError(
        "accepted_chars",
        f"must be from 1 to the completion's length ({completion_length} characters), not {value}",
    )


def _whole_number(item: dict[str, Any], name: str, *, maximum: int, meaning: str) -> int | None:
    value = item.get(name)
    if value is None:
        return None
    if type(value) is not int or not 1 <= value <= maximum:
        raise ItemError(name, f"must be a whole number from 1 to {maximum} ({meaning})")
    return value


def persistence_validate(item: Any) -> PersistenceIn:
    if not isinstance(item, dict):
        raise ItemError("item", "must be a JSON object")
    reject_unknown_fields(item, PERSISTENCE_FIELDS)
    raw_id = item_text(item, "interaction_id", max_len=64)
    client_id = item_id(item, "client_id")
    if (raw_id is None) == (client_id is None):
        raise ItemError(
            "interaction_id", "name exactly one of 'interaction_id' (Strop's id) or 'client_id' (yours)", "required"
        )
    interaction_id = None
    if raw_id is not None:
        if not is_uuid(raw_id):
            raise ItemError("interaction_id", f"{raw_id!r} is not a Strop interaction id (a UUID)")
        interaction_id = uuid.UUID(raw_id)
    checkpoint = _whole_number(
        item, "checkpoint_s", maximum=MAX_CHECKPOINT_S, meaning="seconds after the accept when the text was read"
    )
    if checkpoint is None:
        raise ItemError("checkpoint_s", "is required: the seconds after the accept when the text was read", "required")
    text = item_text(item, "text")
    if text is not None and len(text) > MAX_REPORTED_TEXT:
        raise ItemError(
            "text",
            f"is {len(text)} characters; send at most {MAX_REPORTED_TEXT} (the lines around the insertion point)",
        )
    ratio = item_number(item, "retained_ratio", maximum=1.0, unit=" (the share of the accepted text still there)")
    if (text is None) == (ratio is None):
        raise ItemError(
            "text",
            "send exactly one of 'text' (the text now at the insertion point, or the document) or "
            "'retained_ratio' (the share you measured, 0 to 1)",
            "required",
        )
    return PersistenceIn(
        interaction_id=interaction_id,
        client_id=client_id,
        checkpoint_s=checkpoint,
        text=text,
        retained_ratio=ratio,
        accepted_chars=_whole_number(
            item, "accepted_chars", maximum=MAX_ACCEPTED_CHARS, meaning="the leading characters of a partial accept"
        ),
        occurred_at=item_datetime(item, "occurred_at"),
        metadata=item_metadata(item),
    )
