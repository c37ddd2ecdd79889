"""Server-sent events (``data: {...}`` ... ``data: [DONE]``) to chunks, without I/O: the streams
(``_async_streaming`` and the ``_streaming`` generated from it) only feed these the response's
lines."""

from __future__ import annotations

import json
from typing import Any, Callable

import httpx

from strop._exceptions import APIResponseValidationError, StreamError, error_from_body
from strop._types import CompletionChunk

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


def chunk_from_event(
    data: str, status: int, parse: Parse = CompletionChunk.from_json, response: httpx.Response | None = None
) -> Any:
    """A chunk (``parse`` of the event's JSON), or ``DONE``; an ``{"error": ...}`` event raises
    :class:`StreamError` (with the stream's ``request_id`` when ``response`` is given)."""
    if data.strip() == "[DONE]":
        return DONE
    try:
        payload = json.loads(data)
    except ValueError:
        payload = None
    if isinstance(payload, dict) and "error" in payload:
        raise error_from_body(StreamError, payload, response=response, status_code=status)
    if not isinstance(payload, dict):
        raise APIResponseValidationError(
            f"the stream sent an event that is not a JSON object: {data[:200]!r}",
            response=response,
            status_code=status,
            body=data,
        )
    return parse(payload)


class ChunkReader:
    """Lines of the stream in; a chunk, ``DONE`` or None (no complete event yet) out."""

    def __init__(
        self, status: int, parse: Parse = CompletionChunk.from_json, *, response: httpx.Response | None = None
    ) -> None:
        self._decoder = SSEDecoder()
        self._status = status
        self._parse = parse
        self._response = response

    def feed(self, line: str) -> Any:
        data = self._decoder.feed(line)
        return None if data is None else chunk_from_event(data, self._status, self._parse, self._response)

    def end(self) -> Any:
        data = self._decoder.end()
        return None if data is None else chunk_from_event(data, self._status, self._parse, self._response)
