"""Server-sent events (``data: {...}`` ... ``data: [DONE]``) to chunks, without I/O: the streams
(``_async_streaming`` and the ``_streaming`` generated from it) only feed these the response's
lines."""

from __future__ import annotations

import json
import re
from typing import Any, Callable

import httpx

from strop._exceptions import (
    APIConnectionError,
    APIResponseValidationError,
    StreamError,
    error_from_body,
    error_from_transport,
)
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


class LineSplitter:
    """Bytes of the stream in, its lines out, split only where server-sent events end a line (CRLF,
    LF or CR). Splitting the decoded text with ``str.splitlines`` (as ``httpx``'s ``iter_lines``
    does) also cuts at U+2028, U+2029 and U+0085, which a token may hold raw inside an event's
    JSON: the event would arrive in two halves that are not JSON."""

    _END = re.compile(rb"\r\n|\r|\n")

    def __init__(self) -> None:
        self._rest: list[bytes] = []  # the unfinished line's pieces: each read is scanned once
        self._after_cr = False

    def feed(self, data: bytes) -> list[str]:
        if self._after_cr and data.startswith(b"\n"):  # a CRLF cut between two reads
            data = data[1:]
        if not data:
            return []
        self._after_cr = data.endswith(b"\r")
        *lines, rest = self._END.split(data)
        if not lines:
            self._rest.append(data)
            return []
        if self._rest:
            lines[0] = b"".join([*self._rest, lines[0]])
        self._rest = [rest] if rest else []
        return [line.decode("utf-8", "replace") for line in lines]

    def end(self) -> list[str]:
        """The last line, when the stream ended without a line break."""
        rest, self._rest = b"".join(self._rest), []
        return [rest.decode("utf-8", "replace")] if rest else []


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


def stream_broken(exc: httpx.TransportError, response: httpx.Response) -> APIConnectionError:
    """The error for a stream whose connection broke or timed out after it had started: an
    :class:`APITimeoutError` or :class:`APIConnectionError` (no full answer came), with the
    stream's ``request_id``."""
    error = error_from_transport(exc, response.request)
    error.request_id = response.headers.get("x-request-id")
    return error
