"""A small synchronous client for vLLM's OpenAI-compatible server, over one or more replicas.

Plain Python (httpx), no Django models: usable from Celery tasks, scripts and benchmarks. The
serving endpoints use its asynchronous twin (:mod:`apps.engines.vllm_async`); both share the
replica order, the timeouts, the key and the request bodies (:mod:`apps.engines.vllm_transport`),
and the administrative calls live in :mod:`apps.engines.vllm_admin`.

- Completions ask vLLM for ``logprobs: 1`` and ``return_token_ids: true``, so every answer
  carries the sampled token ids and their logprobs (what the trainer learns on).
- Replicas share nothing: adapters are loaded on every replica and confirmed through
  ``/v1/models``. A completion fails over to the next replica only when the connection could not
  be opened (nothing was sent); any later failure is reported, never retried blindly. For a
  completion, no free connection in the process's pool within its deadline means this process is
  busy, not the replica: :class:`~apps.common.exceptions.ServerBusy` (503 ``server_busy`` +
  Retry-After), and no replica is marked down. The administrative calls (:mod:`vllm_admin`:
  health, models, adapter loads) still read a pool timeout as ``VLLMUnavailable``, as their
  callers expect of a call that did not get through.
- Every call has a timeout. A replica that is down or too slow gives :class:`VLLMUnavailable`
  (503 + Retry-After); vLLM's error JSON ``{"error": {"message", "type", "code"}}`` becomes a
  typed :class:`VLLMError` subclass carrying vLLM's message.
- Every request to every replica carries ``Authorization: Bearer <api_key>`` when the client has
  one: ``api_key`` as given (Strop passes ``settings.VLLM_API_KEY``), else ``$VLLM_API_KEY``, as
  openai-python reads ``$OPENAI_API_KEY``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import httpx

from apps.engines.vllm_admin import ReplicaAdmin
from apps.engines.vllm_errors import (
    AdapterConflict,
    AdapterRejected,
    ModelNotLoaded,
    VLLMBadRequest,
    VLLMError,
    VLLMUnavailable,
    raise_for,
    upstream_busy,
)
from apps.engines.vllm_transport import (
    chunk_of,
    completion_body,
    completion_of,
    mark_down,
    raise_if_key_refused,
    shared_http,
)
from apps.engines.vllm_types import (
    Completion,
    CompletionChoice,
    CompletionChunk,
    ModelCard,
    Usage,
    merge_chunks,
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


class VLLMClient(ReplicaAdmin):
    """Talks to one or more vLLM replicas that serve the same base model (see
    :class:`apps.engines.vllm_transport.Replicas` for the timeouts and the key)."""

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
        body = completion_body(
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
        return completion_of(response.json(), model, replica)

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
        no free connection in the pool is ServerBusy (the pool is every replica's: none is tried
        or marked down); a timeout or a dropped connection after sending is VLLMUnavailable,
        never retried.
        An error status is raised as its typed error, the body read and the connection closed.
        """
        http = shared_http()
        tried: list[str] = []
        for replica, timeouts in self._attempts(affinity, timeout or self._timeout):
            request = http.build_request("POST", f"{replica}{path}", json=body, headers=self._headers, timeout=timeouts)
            try:
                response = http.send(request, stream=stream)
            except httpx.PoolTimeout as exc:  # this process is busy, not the replica: none can take it now
                raise upstream_busy(replica, exc) from exc
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                tried.append(f"{replica}: {exc}")  # nothing reached this replica: the next one may take it
                mark_down(replica)
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
            raise_if_key_refused(response, replica)
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
        body = completion_body(
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
                yield chunk_of(data, replica)
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
