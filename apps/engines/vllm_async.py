"""The asynchronous client to vLLM's OpenAI-compatible server: what the serving endpoints call.

The same calls as :class:`apps.engines.vllm_client.VLLMClient`'s completions and chat, on one
``httpx.AsyncClient`` per event loop, so a stream holds a connection and a coroutine while it
waits for tokens, never a thread. The replica order, the timeouts, the key, the request bodies
and the mapping of vLLM's errors are the synchronous client's (:mod:`apps.engines.vllm_transport`,
:mod:`apps.engines.vllm_errors`): a connection that never opened moves on to the next replica,
no free connection in the pool is this process's busy answer (``server_busy``), any later
failure is :class:`VLLMUnavailable` or a typed :class:`VLLMError`, never retried.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import httpx

from apps.engines.vllm_errors import VLLMUnavailable, raise_for, upstream_busy
from apps.engines.vllm_transport import (
    Replicas,
    chunk_of,
    completion_body,
    completion_of,
    mark_down,
    raise_if_key_refused,
    shared_async_http,
)
from apps.engines.vllm_types import Completion, CompletionChunk, aread_sse_json


def _reason(exc: BaseException) -> str:
    """What failed, for the operator's log: anyio's "All connection attempts failed" names none of
    the OS errors under it (a refused connection, an unreachable host), so they are added."""
    errors: list[BaseException] = []
    cause = exc.__cause__ or exc.__context__
    while cause is not None and not errors:
        if isinstance(cause, BaseExceptionGroup):
            errors = list(cause.exceptions)
        elif isinstance(cause, OSError) and cause.errno:
            errors = [cause]
        cause = cause.__cause__ or cause.__context__
    named = [os.strerror(e.errno) if isinstance(e, OSError) and e.errno else type(e).__name__ for e in errors]
    text = str(exc) or type(exc).__name__  # a timeout says nothing but its kind
    return f"{text}: {'; '.join(named)}" if named else text


class ClosingStream:
    """An asynchronous iterator whose ``aclose()`` also runs ``close`` (idempotent): a generator
    that never started never runs its ``finally``, so what it holds (an open response from vLLM)
    is closed here, whether it was iterated or not."""

    def __init__(self, items: AsyncIterator[Any], close: Callable[[], Awaitable[Any]]) -> None:
        self._items, self._close = items, close

    def __aiter__(self) -> ClosingStream:
        return self

    async def __anext__(self) -> Any:
        return await self._items.__anext__()

    async def aclose(self) -> None:
        try:
            await self._items.aclose()  # type: ignore[attr-defined]
        finally:
            await self._close()


class AsyncVLLMClient(Replicas):
    """Completions and chat completions from the vLLM replicas, awaited."""

    async def _send(
        self,
        body: dict[str, Any],
        timeout: float | None,
        *,
        stream: bool,
        affinity: str | None,
        path: str,
    ) -> tuple[httpx.Response, str]:
        """POST to the first replica that takes the connection; an error status is raised as its
        typed error (the body read and the connection closed)."""
        http = shared_async_http()
        tried: list[str] = []
        for replica, timeouts in self._attempts(affinity, timeout or self._timeout):
            request = http.build_request("POST", f"{replica}{path}", json=body, headers=self._headers, timeout=timeouts)
            try:
                response = await http.send(request, stream=stream)
            except httpx.PoolTimeout as exc:  # this process is busy, not the replica: none can take it now
                raise upstream_busy(replica, exc) from exc
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                tried.append(f"{replica}: {_reason(exc)}")  # nothing reached this replica: the next one may take it
                mark_down(replica)
                continue
            except httpx.TimeoutException as exc:
                raise VLLMUnavailable(f"vLLM at {replica} did not answer in time", replica=replica) from exc
            except httpx.TransportError as exc:
                raise VLLMUnavailable(f"vLLM at {replica} dropped the request: {exc}", replica=replica) from exc
            if response.status_code >= 400 and stream:
                try:
                    await response.aread()
                finally:
                    await response.aclose()
            raise_if_key_refused(response, replica)
            raise_for(response, replica, what="completion")
            return response, replica
        raise VLLMUnavailable(f"no vLLM replica reachable ({'; '.join(tried)})")

    async def complete(
        self,
        *,
        timeout: float | None = None,
        affinity: str | None = None,
        model: str,
        prompt: str | Sequence[int],
        **options: Any,
    ) -> Completion:
        """One completion (``n`` choices) with the sampled token ids and their logprobs; ``options``
        as :func:`apps.engines.vllm_transport.completion_body` takes them."""
        body = completion_body(model=model, prompt=prompt, **options)
        response, replica = await self._send(body, timeout, stream=False, affinity=affinity, path="/v1/completions")
        return completion_of(response.json(), model, replica)

    async def stream(
        self, *, timeout: float | None = None, affinity: str | None = None, **options: Any
    ) -> AsyncIterator[CompletionChunk]:
        """A streamed completion: the request is sent (and HTTP errors raised) by awaiting this call;
        then one :class:`CompletionChunk` per event, the last with ``usage``. Exhaust the iterator
        or ``aclose()`` it to release the connection (vLLM stops generating)."""
        body = {**completion_body(**options), "stream": True, "stream_options": {"include_usage": True}}
        response, replica = await self._send(body, timeout, stream=True, affinity=affinity, path="/v1/completions")
        return ClosingStream(self._chunks(response, replica), response.aclose)

    async def _chunks(self, response: httpx.Response, replica: str) -> AsyncIterator[CompletionChunk]:
        events = aread_sse_json(response, replica)
        try:
            async for data in events:
                yield chunk_of(data, replica)
        finally:
            await events.aclose()  # type: ignore[attr-defined]

    async def chat(
        self, body: dict[str, Any], *, timeout: float | None = None, affinity: str | None = None
    ) -> tuple[dict[str, Any], str]:
        """One chat completion: vLLM's JSON answer as it is, and the replica that gave it."""
        response, replica = await self._send(
            {**body, "stream": False}, timeout, stream=False, affinity=affinity, path="/v1/chat/completions"
        )
        data: dict[str, Any] = response.json()
        return data, replica

    async def chat_stream(
        self, body: dict[str, Any], *, timeout: float | None = None, affinity: str | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """A streamed chat completion, vLLM's JSON events as they are (the last carries ``usage``);
        sent, and HTTP errors raised, by awaiting this call. Exhaust or ``aclose()`` it."""
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        response, replica = await self._send(body, timeout, stream=True, affinity=affinity, path="/v1/chat/completions")
        return ClosingStream(aread_sse_json(response, replica), response.aclose)
