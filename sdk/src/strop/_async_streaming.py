"""Streamed completions: iterate to get chunks until the server's ``[DONE]``. The events are
parsed in ``_sse``; these classes only feed it the open response's lines."""

from __future__ import annotations

from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

import httpx

from strop._chat_types import ChatCompletionChunk
from strop._sse import DONE, ChunkReader, LineSplitter, Parse, stream_broken
from strop._types import CompletionChunk

__all__ = ["AsyncChatCompletionStream", "AsyncCompletionStream"]


class AsyncCompletionStream:
    """Iterate (``async for``) to get :class:`CompletionChunk` objects until the server's
    ``[DONE]``. Use it as a context manager (``async with``, or ``await stream.close()``) when you
    may stop early, so the connection is released. An error event raises
    :class:`~strop.StreamError`, with the stream's ``request_id``; a connection that breaks or
    stalls past the timeout mid-way raises :class:`~strop.APIConnectionError` (or its
    :class:`~strop.APITimeoutError`), with it too."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._iterator = self._chunks()

    _parse: Parse = staticmethod(CompletionChunk.from_json)

    async def _chunks(self) -> AsyncIterator[Any]:
        reader = ChunkReader(self.response.status_code, self._parse, response=self.response)
        lines = LineSplitter()
        try:
            async for data in self.response.aiter_bytes():
                for line in lines.feed(data):
                    chunk = reader.feed(line)
                    if chunk is DONE:
                        return
                    if chunk is not None:
                        yield chunk
            for line in lines.end():
                chunk = reader.feed(line)
                if chunk is DONE:
                    return
                if chunk is not None:
                    yield chunk
            chunk = reader.end()
            if chunk is not None and chunk is not DONE:
                yield chunk
        except httpx.TransportError as exc:  # cut or stalled mid-way: an APIError, as every failure is
            raise stream_broken(exc, self.response) from exc
        finally:
            await self.response.aclose()

    def __aiter__(self) -> AsyncIterator[CompletionChunk]:
        return self._iterator

    async def __anext__(self) -> CompletionChunk:
        return await self._iterator.__anext__()  # type: ignore[no-any-return]

    async def close(self) -> None:
        await self.response.aclose()

    async def __aenter__(self) -> AsyncCompletionStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class AsyncChatCompletionStream(AsyncCompletionStream):
    """A streamed chat completion: :class:`ChatCompletionChunk` objects (each choice's ``delta``:
    the new text or tool-call pieces) until ``[DONE]``."""

    _parse: Parse = staticmethod(ChatCompletionChunk.from_json)

    def __aiter__(self) -> AsyncIterator[ChatCompletionChunk]:  # type: ignore[override]
        return self._iterator

    async def __anext__(self) -> ChatCompletionChunk:  # type: ignore[override]
        return await self._iterator.__anext__()  # type: ignore[no-any-return]
