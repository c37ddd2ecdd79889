"""Fast validation of ingest items.

Batches of up to ``STROP_MAX_BATCH_ITEMS`` items are validated here by hand instead of by a DRF
serializer per item, which would cost more than the database insert itself, with the field checks
of ``apps.common.item_checks``. Every error names the field. The fields each input accepts are the
ones ``contract.py`` declares, which the OpenAPI schema publishes.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from apps.common.item_checks import (
    ItemError,
    item_bool,
    item_datetime,
    item_end_user_id,
    item_id,
    item_logprobs,
    item_metadata,
    item_number,
    item_text,
    item_token_ids,
    reject_unknown_fields,
)
from apps.common.parsing import is_uuid
from apps.interactions.contract import (
    MAX_TURN,
    FeedbackInSchema,
    InteractionInSchema,
    conversation_id_normalize,
    fields_of,
)
from apps.interactions.messages import MessageError, messages_validate, tools_validate, turn_of
from apps.interactions.models import Feedback

MAX_LATENCY_MS = 3_600_000.0  # one hour for one completion
MAX_ACCEPTED_CHARS = 2**31 - 1  # what the column holds; the completion's own length is checked on ingest


@dataclass
class InteractionIn:
    client_id: str
    prompt: str
    prefix: str
    suffix: str
    completion: str
    prompt_token_ids: list[int] | None
    completion_token_ids: list[int] | None
    completion_logprobs: list[float] | None
    model_name: str
    end_user_id: str
    end_user_opted_in: bool | None  # the request's flag; None: the user's current consent applies
    served_at: datetime | None
    latency_ms: float | None
    metadata: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    conversation_id: str = ""
    turn: int | None = None
    tool_calls: list[dict[str, Any]] | None = None  # an agent's reply: stored as metadata["tool_calls"]


@dataclass
class FeedbackIn:
    interaction_id: uuid.UUID | None
    client_id: str | None
    outcome: str
    kept_text: str
    occurred_at: datetime | None
    metadata: dict[str, Any] = field(default_factory=dict)
    accepted_chars: int | None = None  # partial: the leading characters of the completion the user took
    conversation_id: str | None = None  # a session outcome: spread over the session's turns
    turn: int = 0
    discount: float = 0.0


INTERACTION_FIELDS = fields_of(InteractionInSchema)


def _turn(item: dict[str, Any], name: str = "turn") -> int | None:
    value = item.get(name)
    if value is None:
        return None
    if type(value) is not int or not 0 <= value <= MAX_TURN:
        raise ItemError(name, f"must be a whole number from 0 (the first reply of the session) to {MAX_TURN}")
    return value


def _conversation_id(item: dict[str, Any]) -> str | None:
    value = item_id(item, "conversation_id")
    return conversation_id_normalize(value) if value is not None else None


# Tool calls are checked as the chat endpoint checks an assistant message's (apps.interactions.messages),
# in a reply of that shape: its errors are then renamed to the item's field.
_REPLY = "reply"


def _tool_calls(item: dict[str, Any], messages: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    calls = item.get("tool_calls")
    if calls is None:
        return None
    if messages is None:
        raise ItemError("tool_calls", "go with 'messages' (an agent's turn), not with a prompt")
    if not isinstance(calls, list) or not calls:
        raise ItemError("tool_calls", "must be a non-empty list of tool calls (leave it out when the reply made none)")
    try:
        messages_validate([{"role": "assistant", "content": "", "tool_calls": calls}], _REPLY)
    except MessageError as exc:
        where = exc.field.removeprefix(f"{_REPLY}[0].")
        raise ItemError(where if where.startswith("tool_calls") else "tool_calls", exc.message, exc.code) from None
    metadata = item.get("metadata")
    if isinstance(metadata, dict) and "tool_calls" in metadata:
        raise ItemError("tool_calls", "send them once: as 'tool_calls', not also as metadata.tool_calls")
    return calls


def _conversation(item: dict[str, Any]) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None]:
    try:
        messages = messages_validate(item["messages"]) if item.get("messages") is not None else None
        tools = tools_validate(item.get("tools"))
    except MessageError as exc:
        raise ItemError(exc.field, exc.message, exc.code) from None
    if tools is not None and messages is None:
        raise ItemError("tools", "go with 'messages' (a conversation), not with a prompt")
    return messages, tools


def interaction_validate(item: Any) -> InteractionIn:
    if not isinstance(item, dict):
        raise ItemError("item", "must be a JSON object")
    reject_unknown_fields(item, INTERACTION_FIELDS)
    client_id = item_id(item, "client_id", required=True)
    prompt = item_text(item, "prompt")
    prefix = item_text(item, "prefix")
    suffix = item_text(item, "suffix")
    messages, tools = _conversation(item)
    if messages is not None and (prompt is not None or prefix is not None):
        raise ItemError("messages", "send either 'messages' (a conversation) or 'prompt' / 'prefix', not both")
    if prompt is None and prefix is None and messages is None:
        raise ItemError(
            "prompt",
            "send 'prompt', 'prefix' (and 'suffix') for fill-in-the-middle, or 'messages' for a conversation",
            "required",
        )
    tool_calls = _tool_calls(item, messages)
    conversation_id = _conversation_id(item) or ""
    turn = _turn(item)
    if turn is not None and not conversation_id:
        raise ItemError("turn", "needs 'conversation_id' (the session the turn belongs to)")
    if turn is None and conversation_id and messages is not None:
        turn = turn_of(messages)
    completion = item_text(item, "completion", required=True)
    prompt_ids = item_token_ids(item, "prompt_token_ids")
    completion_ids = item_token_ids(item, "completion_token_ids")
    if tool_calls is not None and completion_ids == []:
        raise ItemError("completion_token_ids", "is empty, but the reply made tool calls: send their tokens, or none")
    logprobs = item_logprobs(item, "completion_logprobs")
    if logprobs is not None:
        if completion_ids is None:
            raise ItemError("completion_logprobs", "needs completion_token_ids of the same length")
        if len(logprobs) != len(completion_ids):
            raise ItemError(
                "completion_logprobs",
                f"has {len(logprobs)} values but completion_token_ids has {len(completion_ids)}",
                "length_mismatch",
            )
    return InteractionIn(
        client_id=client_id,  # type: ignore[arg-type]
        prompt=prompt or "",
        prefix=prefix or "",
        suffix=suffix or "",
        completion=completion,  # type: ignore[arg-type]
        prompt_token_ids=prompt_ids,
        completion_token_ids=completion_ids,
        completion_logprobs=logprobs,
        model_name=item_text(item, "model", max_len=200) or "",
        end_user_id=item_end_user_id(item),
        end_user_opted_in=item_bool(item, "opted_in"),
        served_at=item_datetime(item, "served_at"),
        latency_ms=item_number(item, "latency_ms", maximum=MAX_LATENCY_MS, unit=" milliseconds"),
        metadata=item_metadata(item),
        messages=messages,
        tools=tools,
        conversation_id=conversation_id,
        turn=turn,
        tool_calls=tool_calls,
    )


FEEDBACK_FIELDS = fields_of(FeedbackInSchema)
OUTCOMES = frozenset(choice.value for choice in Feedback.Outcome)
# The outcomes that name one completion's text: never a session outcome.
_TEXT_OUTCOMES = (Feedback.Outcome.EDITED, Feedback.Outcome.PARTIAL)


def accepted_chars_range_error(value: int, completion_length: int) -> ItemError:
    """``accepted_chars`` does not fit the completion it names (checked where the completion is known)."""
    if completion_length < 2:
        return ItemError(
            "accepted_chars",
            f"the completion has {completion_length} character{'s' if completion_length != 1 else ''}: "
            "there is no part of it to accept; send 'accepted' or 'rejected'",
        )
    return ItemError(
        "accepted_chars",
        f"must be from 1 to {completion_length - 1} (the completion has {completion_length} characters; "
        f"all of them is 'accepted'), not {value}",
    )


def _accepted_chars(item: dict[str, Any], outcome: str) -> int | None:
    value = item.get("accepted_chars")
    if outcome != Feedback.Outcome.PARTIAL:
        if value is not None:
            raise ItemError("accepted_chars", "goes with outcome 'partial' (the characters of the completion taken)")
        return None
    if value is None:
        raise ItemError(
            "accepted_chars",
            "is required when outcome is 'partial': how many leading characters of the completion the user took",
            "required",
        )
    if type(value) is not int:
        raise ItemError("accepted_chars", "must be a whole number of characters, from 1 to the completion's length - 1")
    if not 1 <= value <= MAX_ACCEPTED_CHARS:
        raise ItemError("accepted_chars", f"must be from 1 to the completion's length - 1, not {value}")
    return value


def feedback_validate(item: Any) -> FeedbackIn:
    if not isinstance(item, dict):
        raise ItemError("item", "must be a JSON object")
    reject_unknown_fields(item, FEEDBACK_FIELDS)
    raw_id = item_text(item, "interaction_id", max_len=64)
    client_id = item_id(item, "client_id")
    conversation_id = _conversation_id(item)
    if (raw_id is not None) + (client_id is not None) + (conversation_id is not None) != 1:
        raise ItemError(
            "interaction_id",
            "name exactly one of 'interaction_id' (Strop's id) or 'client_id' (an interaction), or "
            "'conversation_id' (a session outcome, with 'turn')",
            "required",
        )
    interaction_id = None
    if raw_id is not None:
        if not is_uuid(raw_id):
            raise ItemError("interaction_id", f"{raw_id!r} is not a Strop interaction id (a UUID)")
        interaction_id = uuid.UUID(raw_id)
    outcome = item_text(item, "outcome", required=True)
    if outcome not in OUTCOMES:
        raise ItemError("outcome", f"{outcome!r} is not one of {', '.join(sorted(OUTCOMES))}")
    kept_text = item_text(item, "kept_text")
    if outcome == Feedback.Outcome.EDITED and kept_text is None:
        raise ItemError("kept_text", "is required when outcome is 'edited'", "required")
    accepted_chars = _accepted_chars(item, outcome)
    turn, discount = 0, 0.0
    if conversation_id is not None:
        if outcome in _TEXT_OUTCOMES:
            raise ItemError("outcome", f"{outcome!r} names one completion; send it for the turn's interaction")
        if kept_text is not None:
            raise ItemError(
                "kept_text", "is what the user kept of one answer; send it for the turn's interaction, not the session"
            )
        turn = _turn(item)  # type: ignore[assignment]
        if turn is None:
            raise ItemError(
                "turn", "is required with 'conversation_id': the turn the session outcome follows", "required"
            )
        spread = " (0: the named turn only; 1: every earlier turn in full)"
        discount = item_number(item, "discount", maximum=1.0, unit=spread) or 0.0
    else:
        for name in ("turn", "discount"):
            if item.get(name) is not None:
                raise ItemError(name, "goes with 'conversation_id' (a session outcome)")
    return FeedbackIn(
        interaction_id=interaction_id,
        client_id=client_id,
        outcome=outcome,  # type: ignore[arg-type]
        kept_text=kept_text or "",
        occurred_at=item_datetime(item, "occurred_at"),
        metadata=item_metadata(item),
        accepted_chars=accepted_chars,
        conversation_id=conversation_id,
        turn=turn,
        discount=discount,
    )
