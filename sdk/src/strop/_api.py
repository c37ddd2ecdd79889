"""Every endpoint, described once as a :class:`Call`: path, body, answer parsing, idempotency.
The sync and the asyncio resources only run these. Here: serving, interactions, feedback, the
editor plugins' outcomes, cohorts, models and health; the tenant's management calls (keys,
adapters, training, experiments...) are in ``_management_api``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any
from urllib.parse import quote

import httpx

from strop._chat_types import ChatCompletion
from strop._core import Call, encode_json, read_json, without_none
from strop._literals import Outcome
from strop._management_types import EndUser, Health, Model
from strop._persistence_types import InteractionPersistence, PersistenceResult
from strop._types import (
    BatchResult,
    Completion,
    EditorOutcome,
    Interaction,
    ItemResult,
    Page,
    items_of,
)


def path_id(value: Any, name: str) -> str:
    """A path segment from a caller's id, percent-encoded (``/`` included)."""
    text = str(value)
    if not text:
        raise ValueError(f"{name} must not be empty")
    return quote(text, safe="")


def batch_content(encoded_items: Sequence[bytes]) -> bytes:
    """``{"items": [...]}`` from items already encoded (the batcher encodes each once, at enqueue)."""
    return b'{"items":[' + b",".join(encoded_items) + b"]}"


def _batch(path: str, items: Iterable[Mapping[str, Any]]) -> Call[BatchResult]:
    return Call(
        "POST",
        path,
        parse=lambda r: BatchResult.from_json(read_json(r)),
        content=batch_content([encode_json(dict(item)) for item in items]),
    )


def _page(parse: Any) -> Any:
    return lambda r: Page.from_json(read_json(r), parse)


def list_of(parse: Any) -> Any:
    return lambda r: [parse(item) for item in items_of(read_json(r))]


# ---- completions ----


def completion_create(
    *,
    model: str | None,
    prompt: str | None,
    prefix: str | None,
    suffix: str | None,
    max_tokens: int | None,
    temperature: float | None,
    top_p: float | None,
    stop: str | Sequence[str] | None,
    n: int | None,
    seed: int | None,
    user: str | None,
    opted_in: bool | None,
    stream: bool,
) -> Call[Any]:
    body = without_none(
        model=model,
        prompt=prompt,
        prefix=prefix,
        suffix=suffix,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        stop=stop if stop is None or isinstance(stop, str) else list(stop),
        n=n,
        seed=seed,
        user=user,
        opted_in=opted_in,
    )
    if stream:
        body["stream"] = True
        return Call("POST", "/v1/completions", parse=lambda r: r, body=body, idempotent=False, stream=True)
    return Call(
        "POST",
        "/v1/completions",
        parse=lambda r: Completion.from_json(read_json(r)),
        body=body,
        idempotent=False,
    )


def chat_create(
    *,
    messages: Sequence[Mapping[str, Any]],
    model: str | None,
    tools: Sequence[Mapping[str, Any]] | None,
    tool_choice: str | Mapping[str, Any] | None,
    max_tokens: int | None,
    temperature: float | None,
    top_p: float | None,
    stop: str | Sequence[str] | None,
    n: int | None,
    seed: int | None,
    user: str | None,
    opted_in: bool | None,
    conversation_id: str | None,
    turn: int | None,
    stream: bool = False,
) -> Call[Any]:
    body = without_none(
        model=model,
        messages=[dict(m) for m in messages],
        tools=None if tools is None else [dict(t) for t in tools],
        tool_choice=tool_choice if tool_choice is None or isinstance(tool_choice, str) else dict(tool_choice),
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        stop=stop if stop is None or isinstance(stop, str) else list(stop),
        n=n,
        seed=seed,
        user=user,
        opted_in=opted_in,
        conversation_id=conversation_id,
        turn=turn,
    )
    if stream:
        body["stream"] = True
        return Call("POST", "/v1/chat/completions", parse=lambda r: r, body=body, idempotent=False, stream=True)
    return Call(
        "POST",
        "/v1/chat/completions",
        parse=lambda r: ChatCompletion.from_json(read_json(r)),
        body=body,
        idempotent=False,
    )


# ---- interactions ----


def interaction_item(
    *,
    client_id: str,
    completion: str,
    prompt: str | None = None,
    prefix: str | None = None,
    suffix: str | None = None,
    prompt_token_ids: Sequence[int] | None = None,
    completion_token_ids: Sequence[int] | None = None,
    completion_logprobs: Sequence[float] | None = None,
    model: str | None = None,
    end_user_id: str | None = None,
    opted_in: bool | None = None,
    served_at: datetime | str | None = None,
    latency_ms: float | None = None,
    metadata: Mapping[str, Any] | None = None,
    messages: Sequence[Mapping[str, Any]] | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    conversation_id: str | None = None,
    turn: int | None = None,
) -> dict[str, Any]:
    """One interaction as the API takes it (None fields left out): a ``prompt`` (or ``prefix``),
    or a conversation's ``messages`` (+ ``tools``, ``conversation_id``, ``turn``)."""
    return without_none(
        client_id=client_id,
        messages=None if messages is None else [dict(m) for m in messages],
        tools=None if tools is None else [dict(t) for t in tools],
        conversation_id=conversation_id,
        turn=turn,
        prompt=prompt,
        prefix=prefix,
        suffix=suffix,
        completion=completion,
        prompt_token_ids=None if prompt_token_ids is None else list(prompt_token_ids),
        completion_token_ids=None if completion_token_ids is None else list(completion_token_ids),
        completion_logprobs=None if completion_logprobs is None else list(completion_logprobs),
        model=model,
        end_user_id=end_user_id,
        opted_in=opted_in,
        served_at=served_at,
        latency_ms=latency_ms,
        metadata=None if metadata is None else dict(metadata),
    )


def interaction_log(item: Mapping[str, Any]) -> Call[Interaction]:
    def parse(response: httpx.Response) -> Interaction:
        return Interaction.from_json(read_json(response), created=response.status_code == 201)

    return Call("POST", "/v1/interactions", parse=parse, body=dict(item))


def interaction_log_batch(items: Iterable[Mapping[str, Any]]) -> Call[BatchResult]:
    return _batch("/v1/interactions", items)


def interaction_get(interaction_id: str) -> Call[Interaction]:
    path = f"/v1/interactions/{path_id(interaction_id, 'interaction_id')}"
    return Call("GET", path, parse=lambda r: Interaction.from_json(read_json(r)))


def interaction_persistence(interaction_id: str) -> Call[InteractionPersistence]:
    path = f"/v1/interactions/{path_id(interaction_id, 'interaction_id')}/persistence"
    return Call("GET", path, parse=lambda r: InteractionPersistence.from_json(read_json(r)))


def interaction_list(*, end_user_id: str | None, limit: int | None, offset: int | None) -> Call[Page[Interaction]]:
    params = {"end_user_id": end_user_id, "limit": limit, "offset": offset}
    return Call("GET", "/v1/interactions", parse=_page(Interaction.from_json), params=params)


def editor_autocomplete_outcome(outcome: Mapping[str, Any], *, user: str | None) -> Call[EditorOutcome]:
    # Continue's envelope or a bare outcome, as the plugin posts it; a replay finds its interaction
    # again by completionId, so the call may be retried.
    headers = None if user is None else {"X-Strop-User": user}
    return Call(
        "POST",
        "/v1/editor/autocomplete",
        parse=lambda r: EditorOutcome.from_json(read_json(r)),
        body=dict(outcome),
        headers=headers,
    )


# ---- feedback ----


def feedback_item(
    *,
    outcome: Outcome,
    interaction_id: str | None = None,
    client_id: str | None = None,
    kept_text: str | None = None,
    accepted_chars: int | None = None,
    occurred_at: datetime | str | None = None,
    metadata: Mapping[str, Any] | None = None,
    conversation_id: str | None = None,
    turn: int | None = None,
    discount: float | None = None,
) -> dict[str, Any]:
    """One feedback event as the API takes it. Name the interaction by exactly one of
    ``interaction_id`` (Strop's id) or ``client_id`` (yours), or a session by ``conversation_id``
    with the ``turn`` its outcome follows (and a ``discount`` for earlier turns); the API says
    which is wrong. ``kept_text`` goes with ``edited`` (and may with ``edit_persisted``),
    ``accepted_chars`` with ``partial``."""
    return without_none(
        interaction_id=None if interaction_id is None else str(interaction_id),
        client_id=client_id,
        conversation_id=conversation_id,
        turn=turn,
        discount=discount,
        outcome=outcome,
        kept_text=kept_text,
        accepted_chars=accepted_chars,
        occurred_at=occurred_at,
        metadata=None if metadata is None else dict(metadata),
    )


def feedback_send(item: Mapping[str, Any]) -> Call[ItemResult]:
    return Call("POST", "/v1/feedback", parse=lambda r: ItemResult.from_json(read_json(r)), body=dict(item))


def feedback_send_batch(items: Iterable[Mapping[str, Any]]) -> Call[BatchResult]:
    return _batch("/v1/feedback", items)


def feedback_send_encoded(encoded_items: Sequence[bytes]) -> Call[BatchResult]:
    return Call(
        "POST",
        "/v1/feedback",
        parse=lambda r: BatchResult.from_json(read_json(r)),
        content=batch_content(encoded_items),
    )


# ---- persistence reports ----


def persistence_item(
    *,
    checkpoint_s: int,
    interaction_id: str | None = None,
    client_id: str | None = None,
    text: str | None = None,
    retained_ratio: float | None = None,
    accepted_chars: int | None = None,
    occurred_at: datetime | str | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """What is left of an accepted completion ``checkpoint_s`` seconds after the accept: ``text``
    (what is at the insertion point now, or the document) or ``retained_ratio`` (a share measured by
    the caller). Name the interaction by exactly one of ``interaction_id`` or ``client_id``."""
    return without_none(
        interaction_id=None if interaction_id is None else str(interaction_id),
        client_id=client_id,
        checkpoint_s=checkpoint_s,
        text=text,
        retained_ratio=retained_ratio,
        accepted_chars=accepted_chars,
        occurred_at=occurred_at,
        metadata=None if metadata is None else dict(metadata),
    )


def persistence_send(item: Mapping[str, Any]) -> Call[PersistenceResult]:
    return Call(
        "POST",
        "/v1/feedback/persistence",
        parse=lambda r: PersistenceResult.from_json(read_json(r)),
        body=dict(item),
    )


def persistence_send_batch(items: Iterable[Mapping[str, Any]]) -> Call[BatchResult]:
    return _batch("/v1/feedback/persistence", items)


# ---- cohorts ----


def _user_path(end_user_id: str, tail: str = "") -> str:
    return f"/v1/users/{path_id(end_user_id, 'end_user_id')}{tail}"


def user_opt_in(end_user_id: str) -> Call[EndUser]:
    return Call("POST", _user_path(end_user_id, "/opt-in"), parse=lambda r: EndUser.from_json(read_json(r)))


def user_opt_out(end_user_id: str) -> Call[EndUser]:
    return Call("POST", _user_path(end_user_id, "/opt-out"), parse=lambda r: EndUser.from_json(read_json(r)))


def user_get(end_user_id: str) -> Call[EndUser]:
    return Call("GET", _user_path(end_user_id), parse=lambda r: EndUser.from_json(read_json(r)))


def user_list(
    *, search: str | None, opted_in: bool | None, limit: int | None, offset: int | None, cursor: str | None
) -> Call[Page[EndUser]]:
    params = {"search": search, "opted_in": opted_in, "limit": limit, "offset": offset, "cursor": cursor}
    return Call("GET", "/v1/users", parse=_page(EndUser.from_json), params=params)


def user_import(items: Iterable[Mapping[str, Any]]) -> Call[BatchResult]:
    return _batch("/v1/users/import", items)


def user_erase(end_user_id: str) -> Call[dict[str, Any]]:
    def parse(response: httpx.Response) -> dict[str, Any]:
        if response.status_code == 204 or not response.content:
            return {}
        body = read_json(response)
        return body if isinstance(body, dict) else {"result": body}

    # Not idempotent: once the first try has erased the user, a second answers 404 and the report
    # (which adapter versions learned from them) is lost.
    return Call("DELETE", _user_path(end_user_id), parse=parse, idempotent=False)


# ---- models, health ----


def model_list() -> Call[list[Model]]:
    return Call("GET", "/v1/models", parse=list_of(Model.from_json))


def health_check() -> Call[Health]:
    return Call("GET", "/health", parse=lambda r: Health.from_json(read_json(r)))
