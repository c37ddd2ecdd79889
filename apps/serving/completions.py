"""A completion served through Strop: route it, ask vLLM, apply the stops and the show gate,
record it, and stream it.

What the client asks is adapted to the base model and to vLLM once, in
:mod:`apps.serving.completion_requests`; every stop string applies, however many: vLLM takes
four, Strop applies the rest.

Every served choice is recorded with the exact token ids and logprobs vLLM sampled (cut where a
stop string cut the text). A request vLLM fails is recorded as a :class:`ServingFailure`, never
as a half interaction.

A version with a show gate (``AdapterVersion.show_gate``, fitted on feedback by the training
pipeline: ``learning_shared.show_filter``) withholds a suggestion whose log-probability is below its
threshold: the client gets an empty completion, and the interaction records the decision (and
what was withheld) in ``metadata.show_gate``. A stream through such a version is answered once the
whole suggestion is known, in one chunk per choice: the gate needs every token's log-probability.

Two halves: :func:`completion_plan` (synchronous, on a serving database thread) routes the request
and builds what vLLM is asked; :func:`completion_serve` and :func:`completion_stream` (asynchronous)
ask vLLM and hand their records back to a database thread, so a stream holds no thread while it
waits for tokens.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from django.utils import timezone

from apps.common.exceptions import ApplicationError
from apps.engines.stops import VLLM_MAX_STOP, StopScanner, earliest_stop
from apps.engines.vllm import vllm_async_client
from apps.engines.vllm_async import ClosingStream
from apps.engines.vllm_client import (
    Completion,
    CompletionChoice,
    CompletionChunk,
    Usage,
    merge_chunks,
)
from apps.interactions.ids import time_id
from apps.interactions.served import ServedCompletion, interactions_record_served, served_rows
from apps.serving.completion_requests import CompletionRequest, completion_request_build, suffix_shown, vllm_kwargs
from apps.serving.selectors import ReadAhead
from apps.serving.services import Route, served_by, serving_request_route
from apps.serving.show_gate import show_gate_decisions, show_gate_of, withheld_choice
from apps.serving.stream_record import Piece, StreamRecord
from apps.serving.sync_work import in_db_thread
from apps.serving.vllm_calls import serving_failure_record, vllm_answer
from apps.tenants.models import ApiKey, Tenant


def _apply_stops(choice: CompletionChoice, stops: list[str]) -> CompletionChoice:
    """The stop strings vLLM did not see, applied to a whole choice."""
    hit = earliest_stop(choice.text, stops[VLLM_MAX_STOP:]) if len(stops) > VLLM_MAX_STOP else None
    return choice.cut(hit[0], hit[1]) if hit is not None else choice


def _record(
    tenant: Tenant,
    route: Route,
    request: CompletionRequest,
    completion: Completion,
    ids: list[uuid.UUID],
    *,
    served_at: Any,
    started: float,
    gates: dict[int, dict[str, Any]] | None = None,
    stream_parts: bool = False,
) -> None:
    """Record what was served (``stream_parts``: a stream that wrote parts as it went)."""
    fields = _served_fields(route, request, completion, ids, served_at=served_at, started=started, gates=gates)
    interactions_record_served(tenant, stream_parts=stream_parts, **fields)


def _served_fields(
    route: Route,
    request: CompletionRequest,
    completion: Completion,
    ids: list[uuid.UUID],
    *,
    served_at: Any,
    started: float,
    gates: dict[int, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """What :func:`apps.interactions.served.served_rows` takes of a served completion."""
    gates = gates or {}
    metadata: dict[str, Any] = {
        "temperature": request.temperature,
        "max_tokens": request.max_tokens,
        **request.extra_metadata,
    }
    if request.max_tokens_requested is not None:
        metadata["max_tokens_requested"] = request.max_tokens_requested
    if request.fim_convention:
        metadata["fim_convention"] = request.fim_convention
    if request.is_fim and not suffix_shown(route.adapter.base_model, request):
        metadata["suffix_shown_to_model"] = False
    return dict(
        choices=[
            ServedCompletion(
                ids[c.index], c.text, c.token_ids, c.logprobs, c.finish_reason, show_gate=gates.get(c.index)
            )
            for c in completion.choices
        ],
        prompt=request.prompt,
        prefix=request.prefix,
        suffix=request.suffix,
        prompt_token_ids=completion.prompt_token_ids,
        **route.recorded(),
        end_user_id=request.user,
        end_user_opted_in=request.opted_in,
        served_at=served_at,
        latency_ms=(time.perf_counter() - started) * 1000,
        metadata=metadata,
    )


async def completion_serve(plan: CompletionPlan) -> Completion:
    """Ask vLLM, record one interaction per choice (ids: ``plan.ids``, in choice order), and
    return what the client gets."""
    tenant, route, request = plan.tenant, plan.route, plan.request
    started, served_at = time.perf_counter(), timezone.now()
    completion: Completion = await vllm_answer(
        plan, lambda: vllm_async_client().complete(**plan.kwargs), started=started
    )
    completion = replace(completion, choices=[_apply_stops(c, request.stop) for c in completion.choices])
    gates = show_gate_decisions(completion, plan.gate) if plan.gate is not None else {}
    withheld = {index for index, decision in gates.items() if decision["withheld"]}
    recorded = completion
    if withheld:  # recorded: the sampled tokens and no text (the text stays in the decision)
        recorded = replace(
            completion, choices=[replace(c, text="") if c.index in withheld else c for c in completion.choices]
        )
    await in_db_thread(
        _record, tenant, route, request, recorded, plan.ids, served_at=served_at, started=started, gates=gates
    )
    if withheld:  # the client gets nothing of a withheld choice
        completion = replace(
            completion, choices=[withheld_choice(c) if c.index in withheld else c for c in completion.choices]
        )
    return completion


@dataclass
class _ChoiceStream:
    """One choice of a stream on its way to the client: its stop scanner and whether it ended."""

    scanner: StopScanner | None
    finished: bool = False


async def completion_stream(plan: CompletionPlan) -> AsyncIterator[CompletionChunk]:
    """Open a stream from vLLM (awaiting this call: errors surface before the first byte is sent
    to the client) and return an iterator of the chunks the client gets.

    With more stop strings than vLLM takes, the text is released through a stop scanner and the
    upstream stream is closed as soon as every choice has stopped. At the end what was served is
    recorded: the whole completion, or what the client received if it hung up early. If vLLM
    fails mid-stream, the failure is recorded instead and the error re-raised for the client."""
    tenant, route, request = plan.tenant, plan.route, plan.request
    if plan.gate is not None:
        completion = await completion_serve(plan)
        return _as_stream(completion, include_usage=request.include_usage)
    started, served_at = time.perf_counter(), timezone.now()
    upstream = await vllm_answer(plan, lambda: vllm_async_client().stream(**plan.kwargs), started=started)
    scanning = len(request.stop) > VLLM_MAX_STOP
    states = {i: _ChoiceStream(StopScanner(request.stop) if scanning else None) for i in range(request.n)}

    def client_choice(choice: CompletionChoice, state: _ChoiceStream) -> CompletionChoice:
        if state.scanner is None:
            state.finished = choice.finish_reason is not None
            return choice
        text = state.scanner.feed(choice.text)
        if state.scanner.stopped is not None:
            state.finished = True
            return replace(choice, text=text, finish_reason="stop", stop_reason=state.scanner.stopped)
        if choice.finish_reason is not None:
            state.finished = True
            text += state.scanner.finish()
        return replace(choice, text=text)

    seen: list[CompletionChunk] = []

    def head(index: int) -> tuple:  # on a database thread: the row with nothing served yet
        prompt_ids = next((chunk.prompt_token_ids for chunk in seen if chunk.prompt_token_ids), None)
        empty = Completion("", "", [CompletionChoice(index, "", [], [], None, None)], prompt_ids, None, "")
        fields = _served_fields(route, request, empty, plan.ids, served_at=served_at, started=started)
        return served_rows(tenant, **fields)[0]

    parts = StreamRecord(
        tenant.pk, plan.ids, started=started, head=head, since=lambda cursors: _pieces_since(seen, request.n, cursors)
    )

    async def chunks() -> AsyncIterator[CompletionChunk]:
        nonlocal seen
        try:
            async for chunk in upstream:
                seen.append(chunk)
                if not chunk.choices:  # the usage chunk vLLM sends last (we always ask for it)
                    if request.include_usage:
                        yield chunk
                    continue
                out = [client_choice(c, states[c.index]) for c in chunk.choices if not states[c.index].finished]
                if out:
                    yield replace(chunk, choices=out, usage=None)
                    parts.served()
                if scanning and all(s.finished for s in states.values()):
                    if request.include_usage:
                        yield replace(chunk, choices=[], usage=_usage_of(seen, request, states))
                    break  # closing the upstream iterator closes the connection: vLLM stops generating
        except ApplicationError as exc:
            failure = asyncio.ensure_future(
                parts.then(
                    serving_failure_record,
                    tenant,
                    route=route,
                    user=request.user,
                    error=exc,
                    started=started,
                    streamed=True,
                    stream_parts=plan.ids if parts.end() else None,
                )
            )
            seen = []  # nothing half-served is recorded as an interaction
            await asyncio.shield(failure)
            raise
        finally:
            # Submitted before anything else is awaited: a client that left (this task cancelled)
            # still gets what it was served recorded, on its database thread.
            record = None
            written = parts.end()
            if seen:
                served = _served_from_stream(seen, states)
                record = asyncio.ensure_future(
                    parts.then(
                        _record, tenant, route, request, served, plan.ids, served_at=served_at, started=started,
                        stream_parts=written,
                    )
                )  # fmt: skip
            try:
                await upstream.aclose()  # type: ignore[attr-defined]
            finally:
                if record is not None:
                    await asyncio.shield(record)

    return ClosingStream(chunks(), upstream.aclose)  # type: ignore[attr-defined]  # closed even if never started


def _pieces_since(seen: list[CompletionChunk], n: int, cursors: dict[int, Any]) -> list[tuple[int, Piece, Any]]:
    """What each of the ``n`` choices served in the chunks ``seen`` since its cursor (a position in
    ``seen``): an open stream's parts (``apps.serving.stream_record``). A choice with nothing new (one
    that finished while others go on) has its cursor moved to the end here, so that no later write
    reads its chunks again; one with something new moves once that is written."""
    end, pieces = len(seen), []
    for index in range(n):
        new = [c for chunk in seen[cursors.get(index, 0) : end] for c in chunk.choices if c.index == index]
        if not new:
            cursors[index] = end
            continue
        finish = next((c.finish_reason for c in reversed(new) if c.finish_reason), None)
        piece = Piece(
            "".join(c.text for c in new),
            [t for c in new for t in c.token_ids],
            [p for c in new for p in c.logprobs],
            {"finish_reason": finish} if finish else {},
        )
        pieces.append((index, piece, end))
    return pieces


async def _as_stream(completion: Completion, *, include_usage: bool) -> AsyncIterator[CompletionChunk]:
    """A whole completion as a stream: one chunk per choice, then the usage chunk if asked for."""
    for choice in completion.choices:
        yield CompletionChunk(
            completion.id, completion.model, [choice], completion.prompt_token_ids, None, completion.replica
        )
    if include_usage:
        yield CompletionChunk(completion.id, completion.model, [], None, completion.usage, completion.replica)


def _served_from_stream(seen: list[CompletionChunk], states: dict[int, _ChoiceStream]) -> Completion:
    """The recorded completion: each choice cut where its stop string started."""
    merged = merge_chunks(seen)
    choices = []
    for choice in merged.choices:
        scanner = states[choice.index].scanner
        if scanner is not None and scanner.stopped is not None:
            choice = choice.cut(scanner.sent, scanner.stopped)
        choices.append(choice)
    return replace(merged, choices=choices)


def _usage_of(seen: list[CompletionChunk], request: CompletionRequest, states: dict[int, _ChoiceStream]) -> Usage:
    served = _served_from_stream(seen, states)
    prompt_tokens = len(served.prompt_token_ids or [])
    completion_tokens = sum(len(c.token_ids) for c in served.choices)
    return Usage(prompt_tokens, completion_tokens, prompt_tokens + completion_tokens)


@dataclass
class CompletionPlan:
    """A completion request routed and built, ready for vLLM: the tenant, the request as served,
    its route, the interaction ids (one per choice, drawn now so the answer can name them), what
    vLLM is asked, and the show gate of the serving version if it has one. ``upstream_s``: the
    time spent waiting on vLLM so far (what ``X-Strop-Overhead-Ms`` leaves out)."""

    tenant: Tenant
    request: CompletionRequest
    route: Route
    adapter_name: str
    ids: list[uuid.UUID]
    kwargs: dict[str, Any]
    stream: bool
    gate: dict[str, Any] | None = None
    upstream_s: float = 0.0


def completion_plan(
    tenant: Tenant,
    *,
    fields: dict[str, Any],
    user: str,
    flag: bool | None,
    api_key: ApiKey | None,
    actor: str,
    ahead: ReadAhead | None = None,
) -> CompletionPlan:
    """Plan one completion request (``fields``: the validated body): route it (adapter, the end
    user's consent now, the experiment arm) and build what vLLM is asked."""
    routed = serving_request_route(
        tenant,
        model=fields.get("model") or None,
        user=user,
        flag=flag,
        api_key=api_key,
        actor=actor,
        ahead=ahead,
        sequences=max(fields["n"], fields.get("best_of") or 0),  # vLLM samples best_of, answers n
        max_tokens=fields["max_tokens"],
    )
    sampling = {k: fields[k] for k in ("frequency_penalty", "presence_penalty", "logit_bias", "best_of") if k in fields}
    request = completion_request_build(
        routed.adapter,
        prompt=fields.get("prompt"),
        prefix=fields.get("prefix"),
        suffix=fields["suffix"],
        max_tokens=fields["max_tokens"],
        temperature=fields["temperature"],
        top_p=fields["top_p"],
        stop=fields["stop"],
        n=fields["n"],
        seed=fields["seed"],
        user=user,
        opted_in=routed.opted_in,
        logprobs=fields.get("logprobs"),
        echo=fields["echo"],
        include_usage=fields.get("stream_options", {}).get("include_usage", False),
        sampling=sampling,
        extra_metadata=served_by(api_key),
    )
    return CompletionPlan(
        tenant=tenant,
        request=request,
        route=routed.route,
        adapter_name=routed.adapter.name,
        ids=[time_id() for _ in range(request.n)],  # by time, as every interaction's (ids.py)
        kwargs=vllm_kwargs(routed.route, request),
        stream=fields["stream"],
        gate=show_gate_of(routed.route),
    )
