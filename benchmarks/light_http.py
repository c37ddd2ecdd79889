"""The serving sweep's load generator: HTTP/1.1 over one keep-alive connection per concurrent
caller, on asyncio streams, and nothing else.

A general client costs more CPU per request than the API it measures on this 2-core machine
(httpx spent 10-29 ms of CPU a completion on the sweep's client side, the API 8-18 ms), and the
two share the cores: the figures then say more about the client than about Strop. This one parses
the status line, the headers and a body framed by ``Content-Length`` or ``chunked`` (uvicorn
streams server-sent events chunked), and keeps the body's bytes; a test reads the same answers
through it and through httpx (tests/serving/test_light_http.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import orjson


class ProtocolError(Exception):
    """The server's answer is not HTTP/1.1 as this client reads it."""


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # names lower-cased; a repeated header keeps its last value
    body: bytes

    def json(self) -> object:
        return orjson.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")


class Connection:
    """One keep-alive connection to ``url``'s host, reopened when the server closes it. Not shared:
    one request at a time."""

    def __init__(self, url: str, timeout_s: float = 300.0) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"only http://host:port URLs: {url!r}")
        self.host, self.port = parts.hostname, parts.port or 80
        self.authority = f"{self.host}:{self.port}"
        self.timeout_s = timeout_s
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def close(self) -> None:
        writer, self.reader, self.writer = self.writer, None, None
        if writer is not None:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass

    async def post(
        self, path: str, body: object, headers: dict[str, str], on_headers: Callable[[], None] | None = None
    ) -> Answer:
        """POST ``body`` as JSON to ``path``; the whole answer. ``on_headers`` is called when the
        status line and headers are in (a stream's first byte), before its body is read."""
        return await asyncio.wait_for(self._post(path, orjson.dumps(body), headers, on_headers), self.timeout_s)

    async def _post(
        self, path: str, payload: bytes, headers: dict[str, str], on_headers: Callable[[], None] | None
    ) -> Answer:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        assert self.reader is not None and self.writer is not None
        head = [f"POST {path} HTTP/1.1", f"Host: {self.authority}", "Content-Type: application/json"]
        head += [f"Content-Length: {len(payload)}", *(f"{name}: {value}" for name, value in headers.items())]
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload)
        try:
            return await self._answer(on_headers)
        except BaseException:
            await self.close()  # a half-read answer leaves the connection unusable
            raise

    async def _answer(self, on_headers: Callable[[], None] | None) -> Answer:
        assert self.reader is not None
        reader = self.reader
        status_line = await reader.readline()
        if not status_line.startswith(b"HTTP/1."):
            raise ProtocolError(f"not an HTTP/1.x status line: {status_line[:80]!r}")
        status = int(status_line.split(b" ", 2)[1])
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        if on_headers is not None:
            on_headers()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            pieces = []
            while True:
                size = int((await reader.readline()).split(b";", 1)[0], 16)
                if size == 0:
                    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    break
                pieces.append((await reader.readexactly(size + 2))[:-2])
            body = b"".join(pieces)
        elif "content-length" in headers:
            body = await reader.readexactly(int(headers["content-length"]))
        else:
            body = await reader.read()  # to the end: the server closes
            headers["connection"] = "close"
        if headers.get("connection", "").lower() == "close":
            await self.close()
        return Answer(status, headers, body)
