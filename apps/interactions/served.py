"""What the completion endpoint served, recorded as interactions for training."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from apps.interactions.models import Interaction
from apps.interactions.packed import pack_floats, pack_ids
from apps.interactions.rows import interactions_insert, json_text
from apps.tenants.models import Tenant

# What a served interaction's metadata records of the key that asked for it: its public prefix, so
# that an editor key's feedback reaches only what it served (services.feedback).
SERVED_BY_KEY = "api_key_prefix"


def model_text_storable(text: str) -> str:
    """Text a model wrote, as Postgres stores it in a text column or a jsonb value: a byte-level
    model can sample the byte 0x00, which neither takes (the row would be lost after vLLM
    generated it), so U+FFFD stands in; the token ids keep what was really sampled."""
    return text.replace("\x00", "\ufffd")


@dataclass
class ServedCompletion:
    """One choice Strop served, as it is recorded for training."""

    interaction_id: uuid.UUID
    completion: str
    completion_token_ids: list[int]
    completion_logprobs: list[float]
    finish_reason: str | None
    tool_calls: list[dict[str, Any]] | None = None  # chat: the tool calls the model made
    show_gate: dict[str, Any] | None = None  # the show gate's decision (apps.serving.completions)


@dataclass
class ServedConversation:
    """What a chat completion answered: the conversation so far and the tools offered."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    conversation_id: str
    turn: int | None


def interactions_record_served(tenant: Tenant, *, stream_parts: bool = False, **fields: Any) -> None:
    """Record what the completion endpoint served (``fields``: as :func:`served_rows` takes them):
    one interaction per choice, in one plain autocommitted INSERT (no transaction round trips, no
    ORM compile) on the serving hot path.

    ``stream_parts``: a stream that wrote parts as it went (``apps.interactions.stream_parts``): its
    rows are upserted (the sweeper may have recorded them as partial meanwhile), its parts deleted
    and the feedback that waited on it attached, in one transaction."""
    rows = served_rows(tenant, **fields)
    if not stream_parts:
        interactions_insert(rows)
        return
    from apps.interactions.stream_parts import stream_parts_recorded  # it imports the feedback services

    stream_parts_recorded(tenant, rows)


def served_rows(
    tenant: Tenant,
    *,
    choices: Sequence[ServedCompletion],
    prompt: str,
    prefix: str,
    suffix: str,
    prompt_token_ids: list[int] | None,
    model_name: str,
    adapter_id: int,
    adapter_version_id: int | None,
    experiment_id: int | None,
    experiment_arm: str,
    end_user_id: str,
    end_user_opted_in: bool,
    served_at: datetime,
    latency_ms: float,
    metadata: dict[str, Any],
    conversation: ServedConversation | None = None,
) -> list[tuple]:
    """The interaction rows of what was served, one per choice (``apps.interactions.rows``)."""
    now = timezone.now()
    return [
        (
            choice.interaction_id,
            tenant.pk,
            None,
            Interaction.Source.SERVED.value,
            prompt,
            prefix,
            suffix,
            model_text_storable(choice.completion),
            pack_ids(prompt_token_ids),
            pack_ids(choice.completion_token_ids),
            pack_floats(choice.completion_logprobs),
            model_name,
            adapter_id,
            adapter_version_id,
            experiment_id,
            experiment_arm,
            end_user_id,
            end_user_opted_in,
            served_at,
            now,
            latency_ms,
            json_text(_choice_metadata(metadata, choice)),
            json_text(conversation.messages) if conversation else None,
            json_text(conversation.tools) if conversation else None,
            conversation.conversation_id if conversation else "",
            conversation.turn if conversation else None,
        )
        for choice in choices
    ]


def _choice_metadata(metadata: dict[str, Any], choice: ServedCompletion) -> dict[str, Any]:
    out = {**metadata, "finish_reason": choice.finish_reason}
    if choice.tool_calls:
        out["tool_calls"] = choice.tool_calls
    if choice.show_gate is not None:
        out["show_gate"] = choice.show_gate
    return out
