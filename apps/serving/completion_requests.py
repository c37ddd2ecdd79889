"""What a client's completion request becomes before vLLM sees it.

- A FIM request (``prefix``/``suffix``, OpenAI's insert form ``prompt``/``suffix``, or a prompt a
  plugin built in another model's FIM convention) becomes the base model's own FIM prompt, or the
  prefix alone for a base without FIM tokens (the suffix is then recorded, and the answer says it
  was not shown to the model);
- ``max_tokens`` above the adapter's limit is served at the limit (plugins send 4096);
- vLLM gets the first four stop strings (Strop applies the rest) and the FIM stop tokens.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils.crypto import salted_hmac

from apps.adapters.models import Adapter, BaseModel
from apps.engines.stops import VLLM_MAX_STOP
from apps.serving.prompts import parse_fim_prompt
from apps.serving.services import Route


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
        if recognised is not None:  # with no suffix beside it (``CompletionIn`` refuses one)
            prefix, suffix, fim_convention = recognised.prefix, recognised.suffix, recognised.convention
            options.setdefault("extra_metadata", {})["fim_context_dropped_chars"] = recognised.context_dropped
        elif suffix:  # OpenAI's insert form: the prompt is the text before the completion
            prefix, fim_convention = prompt, "prompt/suffix"
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
    from learning_shared.fim import fim_format

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
    from learning_shared.fim import stop_tokens

    path = Path(model_dir) / "tokenizer.json"
    if not path.is_file():
        return ()
    data = json.loads(path.read_text(encoding="utf-8"))
    ids = {t["content"]: int(t["id"]) for t in data.get("added_tokens", [])}
    vocab = data.get("model", {}).get("vocab", {})
    if isinstance(vocab, dict):
        ids = {**vocab, **ids}
    return tuple(sorted({ids[token] for token in stop_tokens(family) if token in ids}))


def tenant_cache_salt(tenant_id: int) -> str:
    """vLLM's prefix cache salted per tenant (its ``cache_salt``): a tenant's requests reuse the
    prefixes its own requests left cached, never another tenant's, so no tenant can tell from its
    latency what another sent to the same base model. Keyed by ``SECRET_KEY``: not guessable from
    the tenant's id. 64 hex characters (vLLM takes at most 128, without '@', '/' or '\\')."""
    return salted_hmac("strop.serving.cache_salt", str(tenant_id), algorithm="sha256").hexdigest()


def vllm_kwargs(route: Route, request: CompletionRequest) -> dict[str, Any]:
    from learning_shared.fim import build_fim_prompt

    extra: dict[str, Any] = {**request.sampling, "cache_salt": tenant_cache_salt(route.adapter.tenant_id)}
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
        "extra": extra,
        "logprobs": request.logprobs or 1,
        # The tenant's home replica keeps its adapters in vLLM's LoRA slots (settings.VLLM_ROUTING).
        "affinity": f"tenant-{route.adapter.tenant_id}" if settings.VLLM_ROUTING == "tenant" else None,
    }
