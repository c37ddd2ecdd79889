"""A completion served through Strop: build the request, ask vLLM, shape the answer, record it.

What the client asks is adapted to the base model and to vLLM here, once:
- a FIM request (``prefix``/``suffix``, or a prompt a plugin built in another model's FIM
  convention) becomes the base model's own FIM prompt, or the prefix alone for a base without
  FIM tokens (the suffix is then recorded, and the answer says it was not shown to the model);
- ``max_tokens`` above the adapter's limit is served at the limit (plugins send 4096);
- every stop string applies, however many: vLLM takes four, Strop applies the rest.

Every served choice is recorded with the exact token ids and logprobs vLLM sampled (cut where a
stop string cut the text). A request vLLM fails is recorded as a :class:`ServingFailure`, never
as a half interaction.

A version with a show gate (``AdapterVersion.show_gate``, fitted on feedback by the training
pipeline: ``gpu_trainer.show_gate``) withholds a suggestion whose log-probability is below its
threshold: the client gets an empty completion, and the interaction records the decision (and
what was withheld) in ``metadata.show_gate``. A stream through such a version is answered once the
whole suggestion is known, in one chunk per choice: the gate needs every token's log-probability.
"""

from __future__ import annotations

import functools
import json
import random
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

from apps.adapters.loading import adapter_version_load
from apps.adapters.models import Adapter, AdapterVersion, BaseModel
from apps.common.exceptions import ApplicationError
from apps.engines.stops import VLLM_MAX_STOP, StopScanner, earliest_stop
from apps.engines.vllm import vllm_client
from apps.engines.vllm_client import (
    Completion,
    CompletionChoice,
    CompletionChunk,
    ModelNotLoaded,
    Usage,
    VLLMBadRequest,
    merge_chunks,
)
from apps.interactions.models import ServingFailure
from apps.interactions.served import ServedCompletion, interactions_record_served
from apps.serving.prompts import parse_fim_prompt
from apps.serving.services import Route
from apps.tenants.models import Tenant
from gpu_trainer.show_gate import suggestion_score, threshold_of, withholds


@dataclass
class CompletionRequest:
    """One completion request, as Strop serves it (after the cap and the FIM recognition)."""

    prompt: str  # what the client sent as ``prompt`` ("" when it sent prefix/suffix)
    prefix: str
    suffix: str
    is_fim: bool
    max_tokens: int
    temperature: float
    top_p: float
    stop: list[str]
    n: int
    seed: int | None
    user: str
    opted_in: bool
    logprobs: int | None = None  # alternatives per token the client wants back; None: no logprobs
    echo: bool = False
    include_usage: bool = False  # streams: send the usage chunk at the end
    sampling: dict[str, Any] = field(default_factory=dict)  # passed to vLLM as they are
    fim_convention: str = ""  # the client's FIM spelling Strop recognised in ``prompt``
    max_tokens_requested: int | None = None  # set when the adapter's limit lowered it
    extra_metadata: dict[str, Any] = field(default_factory=dict)


def completion_request_build(
    adapter: Adapter, *, prompt: str | None, prefix: str | None, suffix: str, max_tokens: int, **options: Any
) -> CompletionRequest:
    """The request Strop serves for what the client asked (see the module docstring)."""
    fim_convention = ""
    if prompt is not None and prefix is None:
        recognised = parse_fim_prompt(prompt)
        if recognised is not None:
            prefix, suffix, fim_convention = recognised.prefix, recognised.suffix, recognised.convention
            options.setdefault("extra_metadata", {})["fim_context_dropped_chars"] = recognised.context_dropped
    limit = adapter.max_completion_tokens
    return CompletionRequest(
        prompt=prompt or "",
        prefix=prefix or "",
        suffix=suffix if prefix is not None else "",
        is_fim=prefix is not None,
        max_tokens=min(max_tokens, limit),
        max_tokens_requested=max_tokens if max_tokens > limit else None,
        fim_convention=fim_convention,
        **options,
    )


def suffix_shown(base: BaseModel, request: CompletionRequest) -> bool:
    """Whether the model saw the suffix: only a base with FIM tokens can be shown one."""
    from gpu_trainer.fim import fim_format

    if not request.is_fim:
        return False
    try:
        fmt = fim_format(base.family)
    except ValueError:
        return False
    return "{suffix}" in fmt.template


@functools.cache
def fim_stop_token_ids(model_dir: str, family: str) -> tuple[int, ...]:
    """Ids of the family's FIM stop tokens in this model's vocabulary (tokenizer.json, no torch).

    They go to vLLM as ``stop_token_ids``: they are special tokens, stripped from the text, so
    stop *strings* would never match them.
    """
    from gpu_trainer.fim import stop_tokens

    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        return ()
    data = json.loads(path.read_text(encoding="utf-8"))
    ids = {t["content"]: int(t["id"]) for t in data.get("added_tokens", [])}
    vocab = data.get("model", {}).get("vocab", {})
    if isinstance(vocab, dict):
        ids = {**vocab, **ids}
    return tuple(sorted({ids[token] for token in stop_tokens(family) if token in ids}))


def _vllm_kwargs(route: Route, request: CompletionRequest) -> dict[str, Any]:
    from gpu_trainer.fim import build_fim_prompt

    extra: dict[str, Any] = dict(request.sampling)
    prompt = request.prompt
    if request.is_fim:
        base = route.adapter.base_model
        prompt = build_fim_prompt(base.family, request.prefix, request.suffix)
        extra["stop_token_ids"] = list(fim_stop_token_ids(base.path, base.family))
    return {
        "model": route.vllm_model,
        "prompt": prompt,
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "stop": request.stop[:VLLM_MAX_STOP] or None,
        "n": request.n,
        "seed": request.seed,
        "user": request.user or None,
        "extra": extra or None,
        "logprobs": request.logprobs or 1,
        # The tenant's home replica keeps its adapters in vLLM's LoRA slots (settings.VLLM_ROUTING).
        "affinity": f"tenant-{route.adapter.tenant_id}" if settings.VLLM_ROUTING == "tenant" else None,
    }


def with_load_on_demand(route: Route, call: Any) -> Any:
    """Run ``call``; if vLLM lacks the version (a restart, a new replica), load it once and retry."""
    try:
        return call()
    except ModelNotLoaded:
        if route.version is None:
            raise
        adapter_version_load(version_id=route.version.pk)
        route.version.refresh_from_db()
        if route.version.status == AdapterVersion.Status.FAILED:
            raise
        return call()


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
) -> None:
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
    interactions_record_served(
        tenant,
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


def serving_failure_record(
    tenant: Tenant, *, route: Route, user: str, error: ApplicationError, started: float, streamed: bool
) -> None:
    """A request vLLM failed (not one the client got wrong): counted in the arm's error rate."""
    if isinstance(error, VLLMBadRequest) or error.status_code < 500:
        return
    ServingFailure.objects.create(
        tenant=tenant,
        adapter=route.adapter,
        adapter_version=route.version,
        experiment=route.experiment,
        experiment_arm=route.arm,
        end_user_id=user,
        kind=error.code,
        message=error.message[:2000],
        streamed=streamed,
        occurred_at=timezone.now(),
        latency_ms=(time.perf_counter() - started) * 1000,
    )


def show_gate_of(route: Route) -> dict[str, Any] | None:
    """The serving version's show gate, if it has one."""
    gate = route.version.show_gate if route.version is not None else None
    return gate if threshold_of(gate) is not None else None


def _withheld(choice: CompletionChoice) -> CompletionChoice:
    """What the client gets of a withheld suggestion: nothing."""
    return replace(
        choice,
        text="",
        token_ids=[],
        logprobs=[],
        finish_reason="stop",
        stop_reason=None,
        tokens=[],
        text_offset=[],
        top_logprobs=[],
    )


def _show_gate_decisions(completion: Completion, gate: dict[str, Any]) -> dict[int, dict[str, Any]]:
    """Each choice's gate decision, by choice index (none for a choice the model left empty itself)."""
    threshold, explore = threshold_of(gate), float(gate.get("explore") or 0.0)
    decisions = {}
    for choice in completion.choices:
        if not choice.text.strip():  # the model said nothing itself: nothing for the gate to judge
            continue
        score = suggestion_score(choice.logprobs)
        decision: dict[str, Any] = {"score": round(score, 4), "threshold": threshold, "withheld": False}
        if withholds(score, threshold):
            if explore > 0 and random.random() < explore:  # shown anyway, so the next fit sees below its threshold
                decision.update(explored=True, weight=round(1.0 / explore, 4))
            else:
                decision.update(withheld=True, text=choice.text)
        decisions[choice.index] = decision
    return decisions


def completion_serve(tenant: Tenant, *, route: Route, request: CompletionRequest) -> tuple[Completion, list[uuid.UUID]]:
    """Ask vLLM, record one interaction per choice, and return both (ids in choice order)."""
    started, served_at = time.perf_counter(), timezone.now()
    kwargs = _vllm_kwargs(route, request)
    try:
        completion = with_load_on_demand(route, lambda: vllm_client().complete(**kwargs))
    except ApplicationError as exc:
        serving_failure_record(tenant, route=route, user=request.user, error=exc, started=started, streamed=False)
        raise
    completion = replace(completion, choices=[_apply_stops(c, request.stop) for c in completion.choices])
    gate = show_gate_of(route)
    gates = _show_gate_decisions(completion, gate) if gate is not None else {}
    withheld = {index for index, decision in gates.items() if decision["withheld"]}
    recorded = completion
    if withheld:  # recorded: the sampled tokens and no text (the text stays in the decision)
        recorded = replace(
            completion, choices=[replace(c, text="") if c.index in withheld else c for c in completion.choices]
        )
    ids = [uuid.uuid4() for _ in range(request.n)]
    _record(tenant, route, request, recorded, ids, served_at=served_at, started=started, gates=gates)
    if withheld:  # the client gets nothing of a withheld choice
        completion = replace(
            completion, choices=[_withheld(c) if c.index in withheld else c for c in completion.choices]
        )
    return completion, ids


@dataclass
class _ChoiceStream:
    """One choice of a stream on its way to the client: its stop scanner and whether it ended."""

    scanner: StopScanner | None
    finished: bool = False


def completion_stream(
    tenant: Tenant, *, route: Route, request: CompletionRequest
) -> tuple[list[uuid.UUID], Iterator[CompletionChunk]]:
    """Open a stream from vLLM (errors surface before the first byte is sent to the client) and
    return the interaction ids with an iterator of the chunks the client gets.

    With more stop strings than vLLM takes, the text is released through a stop scanner and the
    upstream stream is closed as soon as every choice has stopped. At the end what was served is
    recorded: the whole completion, or what the client received if it hung up early. If vLLM
    fails mid-stream, the failure is recorded instead and the error re-raised for the client."""
    if show_gate_of(route) is not None:
        completion, ids = completion_serve(tenant, route=route, request=request)
        return ids, _as_stream(completion, include_usage=request.include_usage)
    started, served_at = time.perf_counter(), timezone.now()
    kwargs = _vllm_kwargs(route, request)
    try:
        upstream = with_load_on_demand(route, lambda: vllm_client().stream(**kwargs))
    except ApplicationError as exc:
        serving_failure_record(tenant, route=route, user=request.user, error=exc, started=started, streamed=False)
        raise
    ids = [uuid.uuid4() for _ in range(request.n)]
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

    def chunks() -> Iterator[CompletionChunk]:
        seen: list[CompletionChunk] = []
        try:
            for chunk in upstream:
                seen.append(chunk)
                if not chunk.choices:  # the usage chunk vLLM sends last (we always ask for it)
                    if request.include_usage:
                        yield chunk
                    continue
                out = [client_choice(c, states[c.index]) for c in chunk.choices if not states[c.index].finished]
                if out:
                    yield replace(chunk, choices=out, usage=None)
                if scanning and all(s.finished for s in states.values()):
                    if request.include_usage:
                        yield replace(chunk, choices=[], usage=_usage_of(seen, request, states))
                    break  # closing the upstream iterator closes the connection: vLLM stops generating
        except ApplicationError as exc:
            serving_failure_record(tenant, route=route, user=request.user, error=exc, started=started, streamed=True)
            seen = []  # nothing half-served is recorded as an interaction
            raise
        finally:
            upstream.close()
            if seen:  # what was served is recorded, even when the client hung up early
                served = _served_from_stream(seen, states)
                _record(tenant, route, request, served, ids, served_at=served_at, started=started)

    return ids, chunks()


def _as_stream(completion: Completion, *, include_usage: bool) -> Iterator[CompletionChunk]:
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
