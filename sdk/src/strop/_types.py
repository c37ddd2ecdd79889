"""Typed results. Each is a dataclass built from the API's JSON by ``from_json``; a field the
server adds later is ignored, and one it leaves out is None, so the SDK keeps working across
server versions. ``raw`` keeps the whole JSON object for anything not typed here."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Generic, TypeVar
from urllib.parse import parse_qs, urlsplit

T = TypeVar("T")

__all__ = [
    "BatchResult",
    "Completion",
    "CompletionChoice",
    "CompletionChunk",
    "EditorOutcome",
    "FeedbackState",
    "Interaction",
    "ItemError",
    "ItemResult",
    "Page",
    "StropInfo",
    "Usage",
]


def parse_datetime(value: Any) -> datetime | None:
    """ISO 8601 from the API (``...Z`` included, on every supported Python)."""
    if not isinstance(value, str) or not value:
        return None
    text = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def text_or_none(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    return None if value is None else str(value)


def from_fields(cls: type[T], data: Any, **convert: Callable[[Any], Any]) -> T:
    """``cls`` (a dataclass) from a JSON object: each field from the key of its name, through
    ``convert[name]`` when it is given and the value is not None; a missing key is None, a key
    with no field is ignored, and a field named ``raw`` gets the whole object."""
    data = data if isinstance(data, dict) else {}
    values: dict[str, Any] = {}
    for item in dataclasses.fields(cls):  # type: ignore[arg-type]
        if item.name == "raw":
            values["raw"] = data
            continue
        value = data.get(item.name)
        values[item.name] = convert[item.name](value) if value is not None and item.name in convert else value
    return cls(**values)


def items_of(body: Any) -> list[Any]:
    """The objects of a list answer: a bare list, or a page / OpenAI-style list object."""
    if isinstance(body, list):
        return body
    if isinstance(body, dict):
        for key in ("results", "data", "items"):
            value = body.get(key)
            if isinstance(value, list):
                return value
    return []


# ---- completions ----


@dataclass
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def from_json(cls, data: Any) -> Usage | None:
        if not isinstance(data, dict):
            return None
        return cls(
            int(data.get("prompt_tokens") or 0),
            int(data.get("completion_tokens") or 0),
            int(data.get("total_tokens") or 0),
        )


@dataclass
class CompletionChoice:
    """One choice. ``interaction_id`` is the interaction to send feedback on; an empty ``text``
    is a real answer (the model chose to suggest nothing)."""

    index: int
    text: str
    finish_reason: str | None
    interaction_id: str | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CompletionChoice:
        return cls(
            index=int(data.get("index") or 0),
            text=str(data.get("text") or ""),
            finish_reason=text_or_none(data, "finish_reason"),
            interaction_id=text_or_none(data, "interaction_id"),
        )


@dataclass
class StropInfo:
    """What Strop adds to OpenAI's completion shape: the adapter version (vLLM name) that answered."""

    version: str | None

    @classmethod
    def from_json(cls, data: Any) -> StropInfo:
        return cls(version=text_or_none(data, "version") if isinstance(data, dict) else None)


@dataclass
class Completion:
    """A completion (OpenAI's shape). ``id`` is the first choice's interaction id."""

    id: str
    model: str | None
    created: int | None
    choices: list[CompletionChoice]
    strop: StropInfo
    usage: Usage | None
    object: str = "text_completion"

    @property
    def text(self) -> str:
        """The first choice's text."""
        return self.choices[0].text if self.choices else ""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Completion:
        return cls(
            id=str(data.get("id") or ""),
            model=text_or_none(data, "model"),
            created=data.get("created"),
            choices=[CompletionChoice.from_json(c) for c in data.get("choices") or []],
            strop=StropInfo.from_json(data.get("strop")),
            usage=Usage.from_json(data.get("usage")),
            object=str(data.get("object") or "text_completion"),
        )


class CompletionChunk(Completion):
    """One server-sent event of a streamed completion: the text generated since the last chunk.
    ``usage`` is set on the last chunk when the server reports it."""


# ---- interactions and feedback ----


@dataclass
class FeedbackState:
    """The feedback recorded for an interaction (the event with the latest ``occurred_at`` wins).
    ``accepted_chars``: for ``partial``, the leading characters of the completion the user took."""

    outcome: str
    kept_text: str
    accepted_chars: int | None
    occurred_at: datetime | None
    received_at: datetime | None
    updated_at: datetime | None
    events_received: int
    metadata: dict[str, Any]

    @classmethod
    def from_json(cls, data: Any) -> FeedbackState | None:
        if not isinstance(data, dict):
            return None
        return cls(
            outcome=str(data.get("outcome") or ""),
            kept_text=str(data.get("kept_text") or ""),
            accepted_chars=data.get("accepted_chars"),
            occurred_at=parse_datetime(data.get("occurred_at")),
            received_at=parse_datetime(data.get("received_at")),
            updated_at=parse_datetime(data.get("updated_at")),
            events_received=int(data.get("events_received") or 0),
            metadata=dict(data.get("metadata") or {}),
        )


@dataclass
class Interaction:
    """One served or logged completion. ``created`` is set by ``interactions.log``: True when this
    call stored it, False when its ``client_id`` was already known (nothing new was stored);
    None when read back with ``get`` or ``list``. An agent's turn carries the conversation it
    answered (``messages``, ``tools``) and its place in the session (``conversation_id``,
    ``turn``); a completion for a prompt has none (empty values, ``turn`` None)."""

    id: str
    client_id: str | None
    source: str | None
    prompt: str
    prefix: str
    suffix: str
    completion: str
    prompt_token_ids: list[int] | None
    completion_token_ids: list[int] | None
    completion_logprobs: list[float] | None
    model: str | None
    end_user_id: str | None
    opted_in: bool
    served_at: datetime | None
    received_at: datetime | None
    latency_ms: float | None
    metadata: dict[str, Any]
    feedback: FeedbackState | None
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    conversation_id: str | None = None
    turn: int | None = None
    created: bool | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any], *, created: bool | None = None) -> Interaction:
        return cls(
            id=str(data.get("id") or ""),
            client_id=text_or_none(data, "client_id"),
            source=text_or_none(data, "source"),
            prompt=str(data.get("prompt") or ""),
            prefix=str(data.get("prefix") or ""),
            suffix=str(data.get("suffix") or ""),
            completion=str(data.get("completion") or ""),
            prompt_token_ids=data.get("prompt_token_ids"),
            completion_token_ids=data.get("completion_token_ids"),
            completion_logprobs=data.get("completion_logprobs"),
            model=text_or_none(data, "model"),
            end_user_id=text_or_none(data, "end_user_id"),
            opted_in=bool(data.get("opted_in")),
            served_at=parse_datetime(data.get("served_at")),
            received_at=parse_datetime(data.get("received_at")),
            latency_ms=data.get("latency_ms"),
            metadata=dict(data.get("metadata") or {}),
            feedback=FeedbackState.from_json(data.get("feedback")),
            messages=data.get("messages"),
            tools=data.get("tools"),
            conversation_id=text_or_none(data, "conversation_id"),
            turn=data.get("turn"),
            created=created,
        )


@dataclass
class ItemError:
    """Why one item of a batch was rejected; ``field`` names the offending field (``param`` too, the
    name the raised errors use)."""

    code: str
    message: str
    field: str | None

    @property
    def param(self) -> str | None:
        return self.field

    @classmethod
    def from_json(cls, data: Any) -> ItemError | None:
        if not isinstance(data, dict):
            return None
        return cls(
            code=str(data.get("code") or ""), message=str(data.get("message") or ""), field=text_or_none(data, "field")
        )


@dataclass
class ItemResult:
    """The verdict on one item. Interactions: ``created`` / ``duplicate`` / ``rejected``;
    feedback: ``recorded`` / ``pending`` (its interaction has not arrived yet) / ``rejected``.
    ``index`` is the item's position in the batch sent."""

    index: int
    status: str
    id: str | None = None
    client_id: str | None = None
    error: ItemError | None = None

    @property
    def ok(self) -> bool:
        return self.status != "rejected"

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ItemResult:
        return cls(
            index=int(data.get("index") or 0),
            status=str(data.get("status") or ""),
            id=text_or_none(data, "id"),
            client_id=text_or_none(data, "client_id"),
            error=ItemError.from_json(data.get("error")),
        )


@dataclass
class BatchResult:
    """A batch's 207 answer: ``counts`` per status and one result per item, in batch order."""

    counts: dict[str, int]
    results: list[ItemResult]

    @property
    def rejected(self) -> list[ItemResult]:
        return [r for r in self.results if r.status == "rejected"]

    @classmethod
    def from_json(cls, data: Any) -> BatchResult:
        data = data if isinstance(data, dict) else {}
        counts = {k: int(v) for k, v in data.items() if k != "results" and isinstance(v, int)}
        results = sorted((ItemResult.from_json(r) for r in data.get("results") or []), key=lambda r: r.index)
        return cls(counts=counts, results=results)


@dataclass
class EditorOutcome:
    """What an editor plugin's autocomplete outcome became (``editor.autocomplete_outcome``):
    ``status`` is ``created`` / ``duplicate`` (the interaction it was stored as), ``linked`` (it
    matched a completion Strop served, which now carries its ``completionId``: no interaction of
    its own), or ``ignored`` (an event that is not an autocomplete outcome; ``reason`` says why).
    ``linked_to_served``: the feedback landed on a completion Strop served. ``interaction`` and
    ``feedback`` are the verdicts on the interaction and on its feedback (None when there was
    none)."""

    status: str
    linked_to_served: bool | None
    interaction: ItemResult | None
    feedback: ItemResult | None
    reason: str | None
    raw: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: Any) -> EditorOutcome:
        return from_fields(cls, data, interaction=ItemResult.from_json, feedback=ItemResult.from_json)


@dataclass
class Page(Generic[T]):
    """One page of a list: ``count`` in all, this page's ``results``, and the offsets of the
    next and previous pages (None at either end), ready to pass as ``offset=``. A list read by
    keyset (end users) also gives ``next_cursor``, ready to pass as ``cursor=`` (None on the
    last page): the next page costs what the first did, however far in. ``count_capped``: the
    list stopped counting at a cap, so ``count`` is a floor and there are more."""

    count: int
    results: list[T]
    next: str | None
    previous: str | None
    next_cursor: str | None = None
    count_capped: bool = False

    @property
    def next_offset(self) -> int | None:
        return _offset_of(self.next)

    @property
    def previous_offset(self) -> int | None:
        return _offset_of(self.previous)

    @classmethod
    def from_json(cls, data: Any, parse: Callable[[dict[str, Any]], T]) -> Page[T]:
        data = data if isinstance(data, dict) else {"results": items_of(data)}
        results = [parse(item) for item in data.get("results") or []]
        return cls(
            count=int(data.get("count", len(results)) or 0),
            results=results,
            next=text_or_none(data, "next"),
            previous=text_or_none(data, "previous"),
            next_cursor=text_or_none(data, "next_cursor"),
            count_capped=data.get("count_capped") is True,
        )


def _offset_of(url: str | None) -> int | None:
    """The ``offset`` a page link names; None for none (a cursor's link carries no offset)."""
    if not url:
        return None
    values = parse_qs(urlsplit(url).query).get("offset")
    try:
        return int(values[0]) if values else None
    except ValueError:
        return None
