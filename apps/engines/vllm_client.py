"""A small synchronous client for vLLM's OpenAI-compatible server, over one or more replicas.

One job, in one file past 400 lines: every call below shares the replica order, the timeouts,
the key and the mapping of vLLM's errors, so splitting the calls apart would split that too.

Plain Python (httpx), no Django models: usable from views, Celery tasks and benchmarks.

- Completions ask vLLM for ``logprobs: 1`` and ``return_token_ids: true``, so every answer
  carries the sampled token ids and their logprobs (what the trainer learns on).
- Replicas share nothing: adapters are loaded on every replica and confirmed through
  ``/v1/models``. A completion with an ``affinity`` (the tenant) goes to that tenant's home
  replica, chosen by rendezvous hashing, so each replica's LoRA slots hold only its tenants'
  adapters and adding a replica moves only the tenants it takes; without one, round-robin.
  Either way a completion fails over to the next replica only when the connection could not be
  opened (nothing was sent); any later failure is reported, never retried blindly.
- Every call has a timeout. A replica that is down or too slow gives :class:`VLLMUnavailable`
  (503 + Retry-After); vLLM's error JSON ``{"error": {"message", "type", "code"}}`` becomes a
  typed :class:`VLLMError` subclass carrying vLLM's message.
- One ``httpx.Client`` (keep-alive pool) per process, shared by every :class:`VLLMClient`.
- Every request to every replica (completions, chat, adapters, models, health, probes) carries
  ``Authorization: Bearer <api_key>`` when the client has one: ``api_key`` as given (Strop passes
  ``settings.VLLM_API_KEY``), else ``$VLLM_API_KEY``, as openai-python reads ``$OPENAI_API_KEY``.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import httpx

from apps.engines.vllm_errors import (
    AdapterConflict,
    AdapterRejected,
    ModelNotLoaded,
    VLLMBadRequest,
    VLLMError,
    VLLMUnavailable,
    error_parts,
    raise_for,
)
from apps.engines.vllm_types import (
    Completion,
    CompletionChoice,
    CompletionChunk,
    ModelCard,
    Usage,
    merge_chunks,
    parse_choice,
    parse_usage,
    prompt_ids,
    read_sse_json,
)

__all__ = [
    "AdapterConflict",
    "AdapterRejected",
    "Completion",
    "CompletionChoice",
    "CompletionChunk",
    "ModelCard",
    "ModelNotLoaded",
    "Usage",
    "VLLMBadRequest",
    "VLLMClient",
    "VLLMError",
    "VLLMUnavailable",
    "merge_chunks",
]


# --------------------------------------------------------------------------- transport

# A replica that refused a connection is tried last for this long (per process).
REPLICA_COOL_OFF_S = 2.0
_down_until: dict[str, float] = {}

_http_lock = threading.Lock()
_http: httpx.Client | None = None
_http_pid: int | None = None


def _rendezvous(affinity: str, replica: str) -> bytes:
    """Highest-random-weight hashing: the replica with the largest weight is ``affinity``'s home."""
    return hashlib.blake2b(f"{affinity}\n{replica}".encode(), digest_size=8).digest()


def _shared_http() -> httpx.Client:
    """The process's one keep-alive pool; rebuilt after a fork (gunicorn, Celery prefork)."""
    global _http, _http_pid
    pid = os.getpid()
    if _http is None or _http_pid != pid:
        with _http_lock:
            if _http is None or _http_pid != pid:
                limits = httpx.Limits(max_connections=256, max_keepalive_connections=64, keepalive_expiry=30)
                _http = httpx.Client(limits=limits, http1=True, trust_env=False)
                _http_pid = pid
    return _http


def _raise_if_key_refused(response: httpx.Response, replica: str) -> None:
    """401/403 is the operator's mistake (Strop's VLLM_API_KEY is not the one vLLM was started
    with), never the tenant's: a 502 that says so, not vLLM's 4xx passed on as a bad request."""
    if response.status_code in (401, 403):
        raise VLLMError(
            f"vLLM at {replica} refused Strop's API key (HTTP {response.status_code}): "
            "VLLM_API_KEY must be the key vLLM was started with",
            replica=replica,
            vllm_status=response.status_code,
        )


# --------------------------------------------------------------------------- client


class VLLMClient:
    """Talks to one or more vLLM replicas that serve the same base model.

    ``connect_timeout`` bounds opening a connection (a dead replica fails fast and the next one
    is tried); ``timeout`` bounds the wait for a completion (for a stream: between two chunks);
    ``admin_timeout`` bounds adapter loads and listings. ``api_key``: vLLM's key (None: read
    ``$VLLM_API_KEY``; empty: send none).
    """

    def __init__(
        self,
        base_urls: str | Sequence[str],
        *,
        api_key: str | None = None,
        connect_timeout: float = 1.0,
        timeout: float = 30.0,
        admin_timeout: float = 60.0,
    ) -> None:
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls:
            raise ValueError("VLLMClient needs at least one base URL")
        self.base_urls = [u.rstrip("/") for u in urls]
        if api_key is None:
            api_key = os.environ.get("VLLM_API_KEY", "")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._connect_timeout = connect_timeout
        self._timeout = timeout
        self._admin_timeout = admin_timeout
        self._next = itertools.count()

    def _timeouts(self, read: float) -> httpx.Timeout:
        return httpx.Timeout(connect=self._connect_timeout, read=read, write=10.0, pool=self._connect_timeout)

    def _order(self, affinity: str | None = None) -> list[str]:
        """Replicas in the order to try: by rendezvous hash of ``affinity`` (its home first, the
        same fallback every time), else round-robin from this call's turn. Those that just
        refused a connection go last, so a dead replica costs one connect attempt per cool-off,
        not one per request."""
        if affinity is not None:
            ordered = sorted(self.base_urls, key=lambda url: _rendezvous(affinity, url), reverse=True)
        else:
            start = next(self._next) % len(self.base_urls)
            ordered = self.base_urls[start:] + self.base_urls[:start]
        now = time.monotonic()
        return sorted(ordered, key=lambda url: _down_until.get(url, 0.0) > now)

    # ----------------------------------------------------------------- completions

    def _completion_body(self, **kw: Any) -> dict[str, Any]:
        prompt = kw.pop("prompt")
        if not isinstance(prompt, str):
            prompt = [int(t) for t in prompt]
        body: dict[str, Any] = {
            "model": kw.pop("model"),
            "prompt": prompt,
            "max_tokens": kw.pop("max_tokens"),
            "temperature": kw.pop("temperature"),
            "top_p": kw.pop("top_p"),
            "n": kw.pop("n"),
            # At least 1: the sampled token's own logprob is what training needs; a client may
            # want more alternatives (OpenAI allows 5, vLLM 20).
            "logprobs": max(1, int(kw.pop("logprobs") or 1)),
            "return_token_ids": True,
        }
        for key in ("stop", "seed", "user"):
            value = kw.pop(key)
            if value is not None:
                body[key] = value
        body.update(kw.pop("extra") or {})
        return body

    def complete(
        self,
        *,
        model: str,
        prompt: str | Sequence[int],
        max_tokens: int = 16,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop: Sequence[str] | None = None,
        n: int = 1,
        seed: int | None = None,
        user: str | None = None,
        timeout: float | None = None,
        extra: dict[str, Any] | None = None,
        logprobs: int = 1,
        affinity: str | None = None,
    ) -> Completion:
        """One completion (``n`` choices) with the sampled token ids and their logprobs."""
        body = self._completion_body(
            model=model,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            stop=list(stop) if stop else None,
            n=n,
            seed=seed,
            user=user,
            extra=extra,
            logprobs=logprobs,
        )
        response, replica = self._send_completion(body, timeout, stream=False, affinity=affinity)
        data = response.json()
        raw_choices = data.get("choices") or []
        return Completion(
            id=str(data.get("id", "")),
            model=str(data.get("model", model)),
            choices=[parse_choice(c, replica) for c in raw_choices],
            prompt_token_ids=prompt_ids(raw_choices),
            usage=parse_usage(data.get("usage")),
            replica=replica,
        )

    def _send_completion(
        self,
        body: dict[str, Any],
        timeout: float | None,
        *,
        stream: bool,
        affinity: str | None = None,
        path: str = "/v1/completions",
    ) -> tuple[httpx.Response, str]:
        """POST a completion to the first replica that takes the connection.

        Only a connection that never opened moves on to the next replica (nothing was sent);
        a timeout or a dropped connection after sending is VLLMUnavailable, never retried.
        An error status is raised as its typed error, the body read and the connection closed.
        """
        http, timeouts = _shared_http(), self._timeouts(timeout or self._timeout)
        tried: list[str] = []
        for replica in self._order(affinity):
            request = http.build_request("POST", f"{replica}{path}", json=body, headers=self._headers, timeout=timeouts)
            try:
                response = http.send(request, stream=stream)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
                tried.append(f"{replica}: {exc}")  # nothing reached this replica: the next one may take it
                _down_until[replica] = time.monotonic() + REPLICA_COOL_OFF_S
                continue
            except httpx.TimeoutException as exc:
                raise VLLMUnavailable(f"vLLM at {replica} did not answer in time", replica=replica) from exc
            except httpx.TransportError as exc:
                raise VLLMUnavailable(f"vLLM at {replica} dropped the request: {exc}", replica=replica) from exc
            if response.status_code >= 400 and stream:
                try:
                    response.read()
                finally:
                    response.close()
            _raise_if_key_refused(response, replica)
            raise_for(response, replica, what="completion")
            return response, replica
        # The operator's log reads every replica tried; the tenant's copy has the addresses cut out.
        raise VLLMUnavailable(f"no vLLM replica reachable ({'; '.join(tried)})")

    def stream(
        self,
        *,
        model: str,
        prompt: str | Sequence[int],
        max_tokens: int = 16,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop: Sequence[str] | None = None,
        n: int = 1,
        seed: int | None = None,
        user: str | None = None,
        timeout: float | None = None,
        extra: dict[str, Any] | None = None,
        logprobs: int = 1,
        affinity: str | None = None,
    ) -> Iterator[CompletionChunk]:
        """A streamed completion, one :class:`CompletionChunk` per server-sent event.

        The request is sent (and HTTP errors raised) by this call, before the first chunk is
        read; exhaust or ``close()`` the iterator to release the connection. The last chunk
        carries ``usage``; :func:`merge_chunks` rebuilds the whole completion.
        """
        body = self._completion_body(
            model=model,
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            stop=list(stop) if stop else None,
            n=n,
            seed=seed,
            user=user,
            extra=extra,
            logprobs=logprobs,
        )
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
        response, replica = self._send_completion(body, timeout, stream=True, affinity=affinity)
        return self._read_events(response, replica)

    def _read_events(self, response: httpx.Response, replica: str) -> Iterator[CompletionChunk]:
        events = read_sse_json(response, replica)
        try:
            for data in events:
                raw_choices = data.get("choices") or []
                yield CompletionChunk(
                    id=str(data.get("id", "")),
                    model=str(data.get("model", "")),
                    choices=[parse_choice(c, replica) for c in raw_choices],
                    prompt_token_ids=prompt_ids(raw_choices),
                    usage=parse_usage(data.get("usage")),
                    replica=replica,
                )
        finally:
            events.close()  # closes the connection at once: vLLM stops generating

    # ----------------------------------------------------------------- chat

    def chat(
        self, body: dict[str, Any], *, timeout: float | None = None, affinity: str | None = None
    ) -> tuple[dict[str, Any], str]:
        """One chat completion: vLLM's JSON answer as it is, and the replica that gave it. The
        caller builds ``body`` (with ``return_token_ids`` and ``logprobs`` for training)."""
        response, replica = self._send_completion(
            {**body, "stream": False}, timeout, stream=False, affinity=affinity, path="/v1/chat/completions"
        )
        data: dict[str, Any] = response.json()
        return data, replica

    def chat_stream(
        self, body: dict[str, Any], *, timeout: float | None = None, affinity: str | None = None
    ) -> Iterator[dict[str, Any]]:
        """A streamed chat completion, one JSON event at a time (vLLM's chunks as they are; the last
        carries ``usage``). Sent, and HTTP errors raised, by this call; exhaust or close it."""
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        response, replica = self._send_completion(
            body, timeout, stream=True, affinity=affinity, path="/v1/chat/completions"
        )
        return read_sse_json(response, replica)

    # ----------------------------------------------------------------- admin

    def _admin(
        self, replica: str, method: str, path: str, body: Any = None, *, timeout: float | None = None
    ) -> httpx.Response:
        """One admin call; connection failures and timeouts become VLLMUnavailable, a refused key
        a VLLMError."""
        try:
            response = _shared_http().request(
                method,
                f"{replica}{path}",
                json=body,
                headers=self._headers,
                timeout=self._timeouts(timeout or self._admin_timeout),
            )
        except httpx.TimeoutException as exc:
            raise VLLMUnavailable(f"vLLM at {replica} did not answer {path} in time", replica=replica) from exc
        except httpx.TransportError as exc:
            raise VLLMUnavailable(f"vLLM at {replica} is unreachable: {exc}", replica=replica) from exc
        _raise_if_key_refused(response, replica)
        return response

    def prompt_logprobs(self, replica: str, *, model: str, token_ids: Sequence[int]) -> list[float | None]:
        """The log-prob of each given token after those before it (None for the first), on one
        replica: vLLM's ``prompt_logprobs``, read for exactly the tokens sent."""
        body = {
            "model": model,
            "prompt": [int(t) for t in token_ids],
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": 0,
        }
        response = self._admin(replica, "POST", "/v1/completions", body, timeout=self._timeout)
        raise_for(response, replica, what="probe")
        choices = response.json().get("choices") or [{}]
        entries = choices[0].get("prompt_logprobs") or []
        out: list[float | None] = []
        for token, entry in zip(token_ids, entries, strict=False):
            chosen = (entry or {}).get(str(int(token)))
            out.append(float(chosen["logprob"]) if isinstance(chosen, dict) else None)
        return out

    def models(self, replica: str | None = None) -> list[ModelCard]:
        """What one replica serves (default: the first): the base model and every loaded adapter."""
        replica = replica or self.base_urls[0]
        response = self._admin(replica, "GET", "/v1/models")
        raise_for(response, replica, what="model listing")
        return [
            ModelCard(str(m["id"]), m.get("root"), m.get("parent"), m.get("max_model_len"))
            for m in response.json().get("data", [])
        ]

    def health(self, *, timeout: float = 5.0) -> dict[str, bool]:
        """Each replica's ``/health`` (200 means the engine is up)."""
        status: dict[str, bool] = {}
        for replica in self.base_urls:
            try:
                status[replica] = self._admin(replica, "GET", "/health", timeout=timeout).status_code == 200
            except (VLLMUnavailable, VLLMError):
                status[replica] = False
        return status

    def load_adapter(self, name: str, path: str | os.PathLike[str], *, digest: str = "") -> None:
        """Load a LoRA adapter under ``name`` on every replica and confirm it in ``/v1/models``.

        Idempotent: a replica that already has ``name`` from the same path counts as loaded,
        so after a failure on one replica the whole call can simply be repeated.
        Never reload new weights under an old name or path (vLLM's prefix cache is keyed on
        them): every adapter version has its own directory and its own name.
        ``digest`` goes with a load by object-store address (``strop_digest``): the replica's
        plugin refuses files that do not hash to it (``platform/vllm_plugins/strop_vllm_store.py``).
        """
        lora_path = os.fspath(path)
        for replica in self.base_urls:
            self._load_on(replica, name, lora_path, digest)

    def _load_on(self, replica: str, name: str, lora_path: str, digest: str = "") -> None:
        body = {"lora_name": name, "lora_path": lora_path}
        if digest and lora_path.startswith("s3://"):
            body["strop_digest"] = digest
        response = self._admin(replica, "POST", "/v1/load_lora_adapter", body)
        if response.status_code >= 400:
            message, vtype = error_parts(response)
            loaded = {m.id: m for m in self.models(replica)}
            if response.status_code == 400 and name in loaded:
                if _same_source(loaded[name].root, lora_path, name):
                    return
                raise AdapterConflict(
                    f"adapter {name!r} is already loaded from {loaded[name].root}, not {lora_path}",
                    replica=replica,
                    vllm_status=400,
                    vllm_type=vtype,
                )
            if response.status_code in (502, 503, 504):
                raise VLLMUnavailable(f"vLLM at {replica} could not load {name!r}: {message}", replica=replica)
            raise AdapterRejected(
                message,
                replica=replica,
                vllm_status=response.status_code,
                vllm_type=vtype,
                details={"lora_name": name, "lora_path": lora_path},
            )
        card = next((m for m in self.models(replica) if m.id == name), None)
        if card is None or not _same_source(card.root, lora_path, name):
            raise VLLMError(f"vLLM at {replica} accepted {name!r} but does not list it", replica=replica)

    def unload_adapter(self, name: str) -> None:
        """Unload ``name`` from every replica; a replica that does not have it is fine.

        Unloading does not free vLLM's slot at once; prefer letting its LRU evict old versions.
        """
        for replica in self.base_urls:
            response = self._admin(replica, "POST", "/v1/unload_lora_adapter", {"lora_name": name})
            if response.status_code == 404:
                continue
            raise_for(response, replica, what="adapter unload")


def _same_source(root: str | None, lora_path: str, name: str) -> bool:
    """Whether vLLM's ``root`` for an adapter is ``lora_path``: the path itself, or for a version in
    object storage the replica's cached copy, a folder named after the version (never reused)."""
    if root == lora_path:
        return True
    return lora_path.startswith("s3://") and bool(root) and os.path.basename(str(root).rstrip("/")) == name
