"""A chat completion served through Strop: vLLM's chat endpoint, the base model's chat template.

vLLM renders the conversation with the base model's template and is asked for the ids it built
(``return_token_ids``) and the logprob of every sampled token, so each choice is recorded with
exactly the prompt the model saw and the tokens it sampled: training needs no special case for
chat. The answer the client gets is vLLM's, in OpenAI's shape, with Strop's fields added
(``interaction_id`` per choice, ``strop``) and the training-only fields taken out.

A request vLLM fails is recorded as a ServingFailure (as for completions), never as a half
interaction; a stream the client leaves early is recorded as far as it was served. As for
completions, :func:`chat_plan` routes and builds (synchronous, on a serving database thread) and
:func:`chat_serve` / :func:`chat_stream` ask vLLM asynchronously.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.utils import timezone

from apps.adapters.models import Adapter
from apps.common.exceptions import ApplicationError
from apps.engines.vllm import vllm_async_client
from apps.engines.vllm_async import ClosingStream
from apps.interactions.contract import conversation_id_normalize
from apps.interactions.ids import time_id
from apps.interactions.messages import turn_of
from apps.interactions.served import ServedCompletion, ServedConversation, interactions_record_served, served_rows
from apps.interactions.sessions import conversation_outcomes_apply
from apps.serving.chat_choice import ChoiceSoFar
from apps.serving.completion_requests import tenant_cache_salt
from apps.serving.selectors import ReadAhead
from apps.serving.services import Route, served_by, serving_request_route
from apps.serving.stream_record import Piece, StreamRecord
from apps.serving.sync_work import in_db_thread
from apps.serving.vllm_calls import serving_failure_record, vllm_answer
from apps.tenants.models import ApiKey, Tenant

# Keys of vLLM's answer that are for training only (or vLLM's own), never sent to the client.
_HIDDEN_TOP = frozenset(
    {"prompt_token_ids", "prompt_logprobs", "prompt_text", "kv_transfer_params", "ec_transfer_params", "metrics"}
)
_HIDDEN_CHOICE = frozenset({"token_ids", "routed_experts"})


@dataclass
class ChatRequest:
    """One chat completion request, as Strop serves it."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    tool_choice: Any
    max_tokens: int
    temperature: float
    top_p: float
    stop: list[str]
    n: int
    seed: int | None
    user: str
    opted_in: bool
    conversation_id: str
    turn: int | None
    logprobs: bool = False  # the client wants logprobs back
    top_logprobs: int | None = None
    include_usage: bool = False
    sampling: dict[str, Any] = field(default_factory=dict)  # passed to vLLM as they are
    max_tokens_requested: int | None = None  # set when the adapter's limit lowered it
    extra_metadata: dict[str, Any] = field(default_factory=dict)  # recorded with each interaction


def chat_request_build(adapter: Adapter, *, max_tokens: int | None, **options: Any) -> ChatRequest:
    """The request Strop serves: ``max_tokens`` at most the adapter's limit (its default)."""
    limit = adapter.max_completion_tokens
    requested = max_tokens if max_tokens is not None else limit
    return ChatRequest(
        max_tokens=min(requested, limit), max_tokens_requested=requested if requested > limit else None, **options
    )


def _vllm_body(route: Route, request: ChatRequest) -> dict[str, Any]:
    body: dict[str, Any] = {
        **request.sampling,
        "model": route.vllm_model,
        "messages": request.messages,
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "n": request.n,
        # Training needs the sampled tokens' own logprobs and the ids vLLM built and sampled.
        "logprobs": True,
        "top_logprobs": request.top_logprobs or 0,
        "return_token_ids": True,
        "cache_salt": tenant_cache_salt(route.adapter.tenant_id),
    }
    if request.tools is not None:
        body["tools"] = request.tools
    if request.tool_choice is not None:
        body["tool_choice"] = request.tool_choice
    for key in ("stop", "user"):
        value = getattr(request, key)
        if value:
            body[key] = value
    if request.seed is not None:  # 0 is a seed
        body["seed"] = request.seed
    return body


def _affinity(route: Route) -> str | None:
    return f"tenant-{route.adapter.tenant_id}" if settings.VLLM_ROUTING == "tenant" else None


def _record(
    tenant: Tenant,
    route: Route,
    request: ChatRequest,
    choices: dict[int, ChoiceSoFar],
    ids: list[uuid.UUID],
    prompt_token_ids: list[int] | None,
    *,
    served_at: Any,
    started: float,
    stream_parts: bool = False,
) -> None:
    """Record what was served (``stream_parts``: a stream that wrote parts as it went), then a
    session outcome that arrived before it."""
    served = [choices[index].served(ids[index]) for index in sorted(choices)]
    fields = _served_fields(route, request, served, prompt_token_ids, served_at=served_at, started=started)
    interactions_record_served(tenant, stream_parts=stream_parts, **fields)
    if request.conversation_id:  # a session outcome may have arrived before this turn
        conversation_outcomes_apply(tenant, conversation_ids=[request.conversation_id], now=timezone.now())


def _served_fields(
    route: Route,
    request: ChatRequest,
    served: list[ServedCompletion],
    prompt_token_ids: list[int] | None,
    *,
    served_at: Any,
    started: float,
) -> dict[str, Any]:
    """What :func:`apps.interactions.served.served_rows` takes of a served chat completion."""
    metadata: dict[str, Any] = {
        "temperature": request.temperature,
        "max_tokens": request.max_tokens,
        "chat": True,
        **request.extra_metadata,
    }
    if request.max_tokens_requested is not None:
        metadata["max_tokens_requested"] = request.max_tokens_requested
    return dict(
        choices=served,
        prompt="",
        prefix="",
        suffix="",
        prompt_token_ids=prompt_token_ids,
        **route.recorded(),
        end_user_id=request.user,
        end_user_opted_in=request.opted_in,
        served_at=served_at,
        latency_ms=(time.perf_counter() - started) * 1000,
        metadata=metadata,
        conversation=ServedConversation(request.messages, request.tools, request.conversation_id, request.turn),
    )


class ChatAnswer:
    """Shapes vLLM's chat answer (or its stream chunks) for the client."""

    def __init__(self, request: ChatRequest, route: Route, ids: list[uuid.UUID], model: str) -> None:
        self.request, self.ids, self.model = request, [str(i) for i in ids], model
        self.strop: dict[str, Any] = {"version": route.vllm_model, "max_tokens": request.max_tokens}
        if request.max_tokens_requested is not None:
            self.strop["max_tokens_requested"] = request.max_tokens_requested
        if request.conversation_id:
            self.strop["conversation_id"] = request.conversation_id
            self.strop["turn"] = request.turn

    def body(self, data: dict[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in data.items() if k not in _HIDDEN_TOP}
        out["id"], out["model"], out["strop"] = self.ids[0], self.model, self.strop
        choices = []
        for choice in data.get("choices") or []:
            shaped = {k: v for k, v in choice.items() if k not in _HIDDEN_CHOICE}
            if not self.request.logprobs:
                shaped["logprobs"] = None
            index = int(choice.get("index", 0))
            shaped["interaction_id"] = self.ids[index] if index < len(self.ids) else None
            choices.append(shaped)
        out["choices"] = choices
        return out


async def chat_serve(plan: ChatPlan) -> dict[str, Any]:
    """Ask vLLM, record one interaction per choice (``plan.ids``), and return vLLM's answer."""
    tenant, route, request = plan.tenant, plan.route, plan.request
    started, served_at = time.perf_counter(), timezone.now()
    data, _ = await vllm_answer(
        plan, lambda: vllm_async_client().chat(plan.body, affinity=_affinity(route)), started=started
    )
    choices: dict[int, ChoiceSoFar] = {}
    for choice in data.get("choices") or []:
        choices.setdefault(int(choice.get("index", 0)), ChoiceSoFar()).add(choice, message_key="message")
    await in_db_thread(
        _record, tenant, route, request, choices, plan.ids, data.get("prompt_token_ids"),
        served_at=served_at, started=started,
    )  # fmt: skip
    return data


async def chat_stream(plan: ChatPlan) -> AsyncIterator[dict[str, Any]]:
    """Open a stream from vLLM (awaiting this call: errors surface before the first byte goes to
    the client) and return an iterator of vLLM's chunks. What was served is recorded when the
    stream ends, or when the client leaves; a stream vLLM fails records the failure."""
    tenant, route, request = plan.tenant, plan.route, plan.request
    started, served_at = time.perf_counter(), timezone.now()
    upstream = await vllm_answer(
        plan, lambda: vllm_async_client().chat_stream(plan.body, affinity=_affinity(route)), started=started
    )
    choices: dict[int, ChoiceSoFar] = {}
    prompt_ids: list[int] | None = None

    def head(index: int) -> tuple:  # on a database thread: the row with nothing served yet
        empty = [ServedCompletion(plan.ids[index], "", [], [], None)]
        fields = _served_fields(route, request, empty, prompt_ids, served_at=served_at, started=started)
        return served_rows(tenant, **fields)[0]

    def since(cursors: dict[int, Any]) -> list[tuple[int, Piece, Any]]:
        pieces = ((index, choice.since(cursors.get(index))) for index, choice in list(choices.items()))
        return [(index, *piece) for index, piece in pieces if piece is not None]

    parts = StreamRecord(tenant.pk, plan.ids, started=started, head=head, since=since)

    async def chunks() -> AsyncIterator[dict[str, Any]]:
        nonlocal choices, prompt_ids
        try:
            async for data in upstream:
                prompt_ids = prompt_ids or data.get("prompt_token_ids")
                for choice in data.get("choices") or []:
                    choices.setdefault(int(choice.get("index", 0)), ChoiceSoFar()).add(choice, message_key="delta")
                if data.get("choices") or request.include_usage:
                    yield data
                    parts.served()
        except ApplicationError as exc:
            failure = asyncio.ensure_future(
                parts.then(
                    serving_failure_record, tenant, route=route, user=request.user, error=exc, started=started,
                    streamed=True, stream_parts=plan.ids if parts.end() else None,
                )
            )  # fmt: skip
            choices = {}  # nothing half-served is recorded as an interaction
            await asyncio.shield(failure)
            raise
        finally:
            # Submitted before anything else is awaited: a client that left still gets recorded.
            record = None
            written = parts.end()
            if choices:
                record = asyncio.ensure_future(
                    parts.then(
                        _record, tenant, route, request, choices, plan.ids, prompt_ids,
                        served_at=served_at, started=started, stream_parts=written,
                    )
                )  # fmt: skip
            try:
                await upstream.aclose()  # type: ignore[attr-defined]
            finally:
                if record is not None:
                    await asyncio.shield(record)

    return ClosingStream(chunks(), upstream.aclose)  # type: ignore[attr-defined]  # closed even if never started


@dataclass
class ChatPlan:
    """A chat request routed and built, ready for vLLM (as :class:`CompletionPlan` for completions):
    the interaction ids (one per choice) are drawn now, ``body`` is what vLLM is asked."""

    tenant: Tenant
    request: ChatRequest
    route: Route
    adapter_name: str
    ids: list[uuid.UUID]
    body: dict[str, Any]
    stream: bool
    upstream_s: float = 0.0


def chat_plan(
    tenant: Tenant,
    *,
    fields: dict[str, Any],
    user: str,
    flag: bool | None,
    api_key: ApiKey | None,
    actor: str,
    ahead: ReadAhead | None = None,
) -> ChatPlan:
    """Plan one chat request (``fields``: the validated body): route it and build what vLLM is
    asked (the turn of a session counted from its messages when the client named none)."""
    max_tokens = fields.get("max_completion_tokens") or fields.get("max_tokens")
    routed = serving_request_route(
        tenant,
        model=fields.get("model") or None,
        user=user,
        flag=flag,
        api_key=api_key,
        actor=actor,
        ahead=ahead,
        sequences=fields["n"],
        max_tokens=max_tokens,
    )
    sampling = {
        k: fields[k]
        for k in ("frequency_penalty", "presence_penalty", "logit_bias", "parallel_tool_calls", "response_format")
        if k in fields
    }
    conversation_id = conversation_id_normalize(fields["conversation_id"])  # as outcomes and logged turns
    turn = fields.get("turn")
    if conversation_id and turn is None:
        turn = turn_of(fields["messages"])
    request = chat_request_build(
        routed.adapter,
        max_tokens=max_tokens,
        messages=fields["messages"],
        tools=fields.get("tools"),
        tool_choice=fields.get("tool_choice"),
        temperature=fields["temperature"],
        top_p=fields["top_p"],
        stop=fields["stop"],
        n=fields["n"],
        seed=fields["seed"],
        user=user,
        opted_in=routed.opted_in,
        conversation_id=conversation_id,
        turn=turn,
        logprobs=fields["logprobs"],
        top_logprobs=fields.get("top_logprobs"),
        include_usage=fields.get("stream_options", {}).get("include_usage", False),
        sampling=sampling,
        extra_metadata=served_by(api_key),
    )
    return ChatPlan(
        tenant=tenant,
        request=request,
        route=routed.route,
        adapter_name=routed.adapter.name,
        ids=[time_id() for _ in range(request.n)],  # by time, as every interaction's (ids.py)
        body=_vllm_body(routed.route, request),
        stream=fields["stream"],
    )
