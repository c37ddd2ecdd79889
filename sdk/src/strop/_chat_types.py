"""Typed results of the chat completion calls (agents): OpenAI's chat shapes, plus each choice's
``interaction_id``. Lenient like ``_types``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strop._types import StropInfo, Usage, text_or_none

__all__ = ["ChatChoice", "ChatChunkChoice", "ChatCompletion", "ChatCompletionChunk", "ChatMessage"]


@dataclass
class ChatMessage:
    """The assistant's message: its text (None when it only called tools) and its tool calls
    (OpenAI's ``{"id", "type", "function": {"name", "arguments"}}``)."""

    role: str
    content: str | None
    tool_calls: list[dict[str, Any]]

    @classmethod
    def from_json(cls, data: Any) -> ChatMessage:
        data = data if isinstance(data, dict) else {}
        return cls(
            role=str(data.get("role") or "assistant"),
            content=text_or_none(data, "content"),
            tool_calls=[c for c in data.get("tool_calls") or [] if isinstance(c, dict)],
        )


@dataclass
class ChatChoice:
    """One choice of a chat completion; ``interaction_id`` is the turn to send feedback on."""

    index: int
    message: ChatMessage
    finish_reason: str | None
    interaction_id: str | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChatChoice:
        return cls(
            index=int(data.get("index") or 0),
            message=ChatMessage.from_json(data.get("message")),
            finish_reason=text_or_none(data, "finish_reason"),
            interaction_id=text_or_none(data, "interaction_id"),
        )


@dataclass
class ChatCompletion:
    """A chat completion (OpenAI's shape). ``id`` is the first choice's interaction id."""

    id: str
    model: str | None
    created: int | None
    choices: list[ChatChoice]
    strop: StropInfo
    usage: Usage | None
    object: str = "chat.completion"

    @property
    def content(self) -> str:
        """The first choice's text ("" when it only called tools)."""
        return (self.choices[0].message.content or "") if self.choices else ""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChatCompletion:
        return cls(
            id=str(data.get("id") or ""),
            model=text_or_none(data, "model"),
            created=data.get("created"),
            choices=[ChatChoice.from_json(c) for c in data.get("choices") or []],
            strop=StropInfo.from_json(data.get("strop")),
            usage=Usage.from_json(data.get("usage")),
            object=str(data.get("object") or "chat.completion"),
        )


@dataclass
class ChatChunkChoice:
    """One choice of a chat stream chunk: ``delta`` holds what is new (the role first, then text
    or tool-call pieces, each with its ``index``); ``interaction_id`` is the turn's."""

    index: int
    delta: ChatMessage
    finish_reason: str | None
    interaction_id: str | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChatChunkChoice:
        return cls(
            index=int(data.get("index") or 0),
            delta=ChatMessage.from_json(data.get("delta")),
            finish_reason=text_or_none(data, "finish_reason"),
            interaction_id=text_or_none(data, "interaction_id"),
        )


@dataclass
class ChatCompletionChunk:
    """One server-sent event of a streamed chat completion; ``usage`` on the last one when asked."""

    id: str
    model: str | None
    created: int | None
    choices: list[ChatChunkChoice]
    strop: StropInfo
    usage: Usage | None
    object: str = "chat.completion.chunk"

    @property
    def content(self) -> str:
        """The first choice's new text."""
        return (self.choices[0].delta.content or "") if self.choices else ""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ChatCompletionChunk:
        return cls(
            id=str(data.get("id") or ""),
            model=text_or_none(data, "model"),
            created=data.get("created"),
            choices=[ChatChunkChoice.from_json(c) for c in data.get("choices") or []],
            strop=StropInfo.from_json(data.get("strop")),
            usage=Usage.from_json(data.get("usage")),
            object=str(data.get("object") or "chat.completion.chunk"),
        )
