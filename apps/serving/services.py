"""Serving: pick the version for a request, ask vLLM, record what was served.

Every adapter version has its own vLLM name and directory, so moving the production pointer
is one row update: a request resolves its version once, at its start, and finishes on it.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.utils import timezone

from apps.adapters.models import Adapter, AdapterVersion
from apps.adapters.services import adapter_version_mark_failed, adapter_version_mark_loaded
from apps.common.observability.metrics import adapter_load_counted
from apps.interactions.services import ServedCompletion, interactions_record_served
from apps.serving.vllm_client import (
    AdapterRejected,
    Completion,
    CompletionChunk,
    ModelNotLoaded,
    VLLMClient,
    VLLMError,
    VLLMUnavailable,
    merge_chunks,
)
from apps.tenants.models import Tenant


@functools.cache
def _client(urls: tuple[str, ...], timeout: float) -> VLLMClient:
    return VLLMClient(list(urls), timeout=timeout)


def vllm_client() -> VLLMClient:
    return _client(tuple(settings.VLLM_BASE_URLS), settings.VLLM_TIMEOUT_S)


@dataclass(frozen=True)
class Route:
    """What serves one request: a version (None = the base model alone) and the experiment arm."""

    adapter: Adapter
    version: AdapterVersion | None
    arm: str = ""

    @property
    def vllm_model(self) -> str:
        return self.version.vllm_name if self.version is not None else self.adapter.base_model.name


def serving_route(tenant: Tenant, *, adapter: Adapter, end_user_id: str) -> Route:
    """Production today. The experiments domain hooks in here to send opted-in users to an arm."""
    version = adapter.production_version
    if version is not None and version.status == AdapterVersion.Status.FAILED:
        version = None  # never route to a version vLLM refused; the base model still answers
    return Route(adapter=adapter, version=version)


def adapter_version_load(*, version_id: int) -> str:
    """Load a version on every replica; a refusal marks it failed with vLLM's message."""
    version = AdapterVersion.objects.select_related("tenant").get(pk=version_id)
    if version.status == AdapterVersion.Status.FAILED:
        return "failed"
    try:
        vllm_client().load_adapter(version.vllm_name, version.artifact_path)
    except AdapterRejected as exc:
        adapter_load_counted("rejected")
        adapter_version_mark_failed(version, message=f"vLLM refused the adapter: {exc.message}")
        return "failed"
    except VLLMUnavailable:
        adapter_load_counted("unavailable")
        raise
    except VLLMError:
        adapter_load_counted("error")
        raise
    adapter_load_counted("loaded")
    adapter_version_mark_loaded(version)
    return "loaded"


@dataclass
class CompletionRequest:
    prompt: str
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
    extra_metadata: dict[str, Any] = field(default_factory=dict)


@functools.cache
def fim_stop_token_ids(model_dir: str, family: str) -> tuple[int, ...]:
    """Ids of the family's FIM stop tokens in this model's vocabulary (tokenizer.json, no torch).

    They go to vLLM as ``stop_token_ids``: they are special tokens, stripped from the text, so
    stop *strings* would never match them (and vLLM takes at most four stop strings).
    """
    import json
    from pathlib import Path

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


def _vllm_prompt(route: Route, request: CompletionRequest) -> tuple[str, dict[str, Any]]:
    from gpu_trainer.fim import build_fim_prompt

    if request.is_fim:
        base = route.adapter.base_model
        stop_ids = fim_stop_token_ids(base.path, base.family)
        return build_fim_prompt(base.family, request.prefix, request.suffix), {"stop_token_ids": list(stop_ids)}
    return request.prompt, {}


def _with_load_on_demand(route: Route, call: Any) -> Any:
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


def _record(
    tenant: Tenant,
    route: Route,
    request: CompletionRequest,
    completion: Completion,
    ids: list[uuid.UUID],
    *,
    served_at: Any,
    started: float,
) -> None:
    interactions_record_served(
        tenant,
        choices=[
            ServedCompletion(ids[c.index], c.text, c.token_ids, c.logprobs, c.finish_reason) for c in completion.choices
        ],
        prompt=request.prompt,
        prefix=request.prefix,
        suffix=request.suffix,
        prompt_token_ids=completion.prompt_token_ids,
        model_name=route.vllm_model,
        adapter_id=route.adapter.pk,
        adapter_version_id=route.version.pk if route.version else None,
        experiment_arm=route.arm,
        end_user_id=request.user,
        end_user_opted_in=request.opted_in,
        served_at=served_at,
        latency_ms=(time.perf_counter() - started) * 1000,
        metadata={"temperature": request.temperature, "max_tokens": request.max_tokens, **request.extra_metadata},
    )


def _vllm_kwargs(route: Route, request: CompletionRequest) -> dict[str, Any]:
    prompt, extra = _vllm_prompt(route, request)
    return {
        "model": route.vllm_model,
        "prompt": prompt,
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
        "top_p": request.top_p,
        "stop": request.stop or None,
        "n": request.n,
        "seed": request.seed,
        "user": request.user or None,
        "extra": extra or None,
    }


def completion_serve(tenant: Tenant, *, route: Route, request: CompletionRequest) -> tuple[Completion, list[uuid.UUID]]:
    """Ask vLLM, record one interaction per choice, and return both (ids in choice order)."""
    started, served_at = time.perf_counter(), timezone.now()
    kwargs = _vllm_kwargs(route, request)
    completion = _with_load_on_demand(route, lambda: vllm_client().complete(**kwargs))
    ids = [uuid.uuid4() for _ in range(request.n)]
    _record(tenant, route, request, completion, ids, served_at=served_at, started=started)
    return completion, ids


def completion_stream(
    tenant: Tenant, *, route: Route, request: CompletionRequest
) -> tuple[list[uuid.UUID], Iterator[CompletionChunk]]:
    """Open a stream from vLLM (errors surface before the first byte is sent to the client) and
    return the interaction ids with an iterator of chunks that records the interaction at its end."""
    started, served_at = time.perf_counter(), timezone.now()
    kwargs = _vllm_kwargs(route, request)
    upstream = _with_load_on_demand(route, lambda: vllm_client().stream(**kwargs))
    ids = [uuid.uuid4() for _ in range(request.n)]

    def chunks() -> Iterator[CompletionChunk]:
        seen: list[CompletionChunk] = []
        try:
            for chunk in upstream:
                seen.append(chunk)
                yield chunk
        finally:
            if seen:  # what was served is recorded, even when the client hung up early
                _record(tenant, route, request, merge_chunks(seen), ids, served_at=served_at, started=started)

    return ids, chunks()
