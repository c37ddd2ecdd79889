"""Streamed completions: server-sent events (``data: {...}`` ... ``data: [DONE]``) read line by line.

:class:`ChunkReader` does no I/O; :class:`CompletionStream` and
:class:`AsyncCompletionStream` only feed them lines from the open response.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from types import TracebackType
from typing import Any, Callable

import httpx

from strop._exceptions import StreamError, StropError, error_from_body
from strop._types import ChatCompletionChunk, CompletionChunk

__all__ = ["AsyncChatCompletionStream", "AsyncCompletionStream", "ChatCompletionStream", "CompletionStream"]

Parse = Callable[[dict[str, Any]], Any]


class SSEDecoder:
    """Lines in, event data out: ``data:`` lines accumulate until a blank line ends the event.
    Comments (``:``) and the other fields (``event``, ``id``, ``retry``) are ignored."""

    def __init__(self) -> None:
        self._data: list[str] = []

    def feed(self, line: str) -> str | None:
        line = line.rstrip("\r\n")
        if not line:
            if not self._data:
                return None
            data, self._data = "\n".join(self._data), []
            return data
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if name == "data":
            self._data.append(value[1:] if value.startswith(" ") else value)
        return None

    def end(self) -> str | None:
        """What is left when the stream ends without a final blank line."""
        return self.feed("")


DONE = object()


def chunk_from_event(data: str, status: int, parse: Parse = CompletionChunk.from_json) -> Any:
    """A chunk (``parse`` of the event's JSON), or ``DONE``; an ``{"error": ...}`` event raises
    :class:`StreamError`."""
    if data.strip() == "[DONE]":
        return DONE
    try:
        payload = json.loads(data)
    except ValueError:
        raise StropError(f"the completion stream sent an event that is not JSON: {data[:200]!r}") from None
    if isinstance(payload, dict) and "error" in payload:
        raise error_from_body(status, payload, cls=StreamError)
    if not isinstance(payload, dict):
        raise StropError(f"the completion stream sent an unexpected event: {data[:200]!r}")
    return parse(payload)


class ChunkReader:
    """Lines of the stream in; a chunk, ``DONE`` or None (no complete event yet) out."""

    def __init__(self, status: int, parse: Parse = CompletionChunk.from_json) -> None:
        self._decoder = SSEDecoder()
        self._status = status
        self._parse = parse

    def feed(self, line: str) -> Any:
        data = self._decoder.feed(line)
        return None if data is None else chunk_from_event(data, self._status, self._parse)

    def end(self) -> Any:
        data = self._decoder.end()
        return None if data is None else chunk_from_event(data, self._status, self._parse)


class CompletionStream:
    """Iterate to get :class:`CompletionChunk` objects until the server's ``[DONE]``. Use it as a
    context manager (or call :meth:`close`) when you may stop early, so the connection is released.
    An error event raises :class:`~strop.StreamError`."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._iterator = self._chunks()

    _parse: Parse = staticmethod(CompletionChunk.from_json)

    def _chunks(self) -> Iterator[Any]:
        reader = ChunkReader(self.response.status_code, self._parse)
        try:
            for line in self.response.iter_lines():
                chunk = reader.feed(line)
                if chunk is DONE:
                    return
                if chunk is not None:
                    yield chunk
            chunk = reader.end()
            if chunk is not None and chunk is not DONE:
                yield chunk
        finally:
            self.response.close()

    def __iter__(self) -> Iterator[CompletionChunk]:
        return self._iterator

    def __next__(self) -> CompletionChunk:
        return next(self._iterator)

    def close(self) -> None:
        self.response.close()

    def __enter__(self) -> CompletionStream:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncCompletionStream:
    """The asyncio twin of :class:`CompletionStream`: ``async for chunk in stream``."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._iterator = self._chunks()

    _parse: Parse = staticmethod(CompletionChunk.from_json)

    async def _chunks(self) -> AsyncIterator[Any]:
        reader = ChunkReader(self.response.status_code, self._parse)
        try:
            async for line in self.response.aiter_lines():
                chunk = reader.feed(line)
                if chunk is DONE:
                    return
                if chunk is not None:
                    yield chunk
            chunk = reader.end()
            if chunk is not None and chunk is not DONE:
                yield chunk
        finally:
            await self.response.aclose()

    def __aiter__(self) -> AsyncIterator[CompletionChunk]:
        return self._iterator

    async def __anext__(self) -> CompletionChunk:
        return await self._iterator.__anext__()

    async def close(self) -> None:
        await self.response.aclose()

    async def __aenter__(self) -> AsyncCompletionStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class ChatCompletionStream(CompletionStream):
    """A streamed chat completion: iterate to get :class:`ChatCompletionChunk` objects (each
    choice's ``delta``: the new text or tool-call pieces) until ``[DONE]``."""

    _parse: Parse = staticmethod(ChatCompletionChunk.from_json)

    def __iter__(self) -> Iterator[ChatCompletionChunk]:  # type: ignore[override]
        return self._iterator

    def __next__(self) -> ChatCompletionChunk:  # type: ignore[override]
        return next(self._iterator)  # type: ignore[no-any-return]


class AsyncChatCompletionStream(AsyncCompletionStream):
    """The asyncio twin of :class:`ChatCompletionStream`."""

    _parse: Parse = staticmethod(ChatCompletionChunk.from_json)

    def __aiter__(self) -> AsyncIterator[ChatCompletionChunk]:  # type: ignore[override]
        return self._iterator

    async def __anext__(self) -> ChatCompletionChunk:  # type: ignore[override]
        return await self._iterator.__anext__()  # type: ignore[no-any-return]
