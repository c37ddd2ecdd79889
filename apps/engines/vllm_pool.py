"""The asynchronous client's keep-alive pool: httpx's transport on httpcore's HTTP/1.1 connections,
with O(1) bookkeeping per request.

httpcore's own pool (1.0.9; httpcore2 2.16.2 too, less the quadratic parts) walks every connection
it holds whenever a request starts or ends, asking the kernel about each idle one (``getpeername``
and ``poll``): with the hundreds of connections one API process holds to vLLM, that walk was a
third of the process's CPU at 64 completions at once (py-spy, 2026-11-27). Here the idle
connections to each origin are a stack: a request takes the most recently used one and asks the
kernel about it alone, and gives it back when its answer is read or closed. What each connection
does (connecting within the connect deadline, HTTP/1.1, closing one whose answer was not read to
the end, so vLLM stops generating) is httpcore's, on asyncio's sockets (``vllm_socket``), and its
errors reach the caller as httpx's, through httpx's own transport.

Limits: ``max_connections`` bounds the requests in flight, each on its own connection (a request
waits for a slot at most its ``pool`` deadline, then :class:`httpcore.PoolTimeout`);
``max_keepalive_connections`` bounds the idle ones to each replica; an idle connection older than
``keepalive_expiry`` is closed rather than reused. No free slot within the deadline is this process
being busy, not a replica being down (:func:`apps.engines.vllm_errors.upstream_busy`).

Cancellation: closes run under ``anyio.CancelScope(shield=True)``, which holds off anyio's
cancellation (a cancelled scope around the caller) and nothing else. asyncio's own, ``Task.cancel()``
(a client that left, ``asyncio.timeout``), still raises ``CancelledError`` at a close's first await;
what must happen happens anyway: a slot is given back in ``finally``, a connection whose answer was
not closed cleanly is discarded rather than kept, and httpcore's close of a connection aborts its
socket before it first awaits.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpcore
import httpx

from apps.engines.vllm_socket import AsyncioBackend

_Idle = deque[tuple[httpcore.AsyncHTTPConnection, float]]
_SOCKETS = AsyncioBackend()  # asyncio's transports, not anyio's streams (apps/engines/vllm_socket.py)


class UpstreamPool:
    """What :class:`httpx.AsyncHTTPTransport` calls its pool: ``handle_async_request`` and ``aclose``."""

    def __init__(self, *, max_connections: int, max_keepalive_connections: int, keepalive_expiry: float) -> None:
        self._slots = asyncio.Semaphore(max_connections)
        self._max_idle = max_keepalive_connections
        self._keepalive_expiry = keepalive_expiry
        self._idle: dict[tuple[bytes, bytes, int], _Idle] = {}  # by scheme, host and port
        self._open: set[httpcore.AsyncHTTPConnection] = set()
        self._ssl_context: ssl.SSLContext | None = None  # made for the first https replica

    async def handle_async_request(self, request: httpcore.Request) -> httpcore.Response:
        if request.url.scheme not in (b"http", b"https"):
            raise httpcore.UnsupportedProtocol(f"Request URL has an unsupported protocol {request.url.scheme!r}.")
        origin = request.url.origin
        await self._acquire(request.extensions.get("timeout", {}).get("pool"))
        try:
            while True:
                connection = await self._take_idle(origin) or self._connect(origin)
                try:
                    response = await connection.handle_async_request(request)
                except httpcore.ConnectionNotAvailable:
                    await self._discard(connection)  # closed since it was taken: another one
                    continue
                except BaseException:
                    await self._discard(connection)
                    raise
                break
        except BaseException:
            self._slots.release()
            raise
        return httpcore.Response(
            status=response.status,
            headers=response.headers,
            content=_ReleasingStream(response.stream, self, connection, origin),
            extensions=response.extensions,
        )

    async def _acquire(self, timeout: float | None) -> None:
        if not self._slots.locked():
            await self._slots.acquire()  # a free slot: taken without suspending
            return
        try:
            async with asyncio.timeout(timeout):
                await self._slots.acquire()
        except TimeoutError:
            raise httpcore.PoolTimeout(f"no free upstream connection in {timeout} s") from None

    async def _take_idle(self, origin: httpcore.Origin) -> httpcore.AsyncHTTPConnection | None:
        """The most recently used idle connection to ``origin`` that the server has not closed; on
        the way, every idle one that outlived ``keepalive_expiry`` (the oldest are at the bottom, and
        each is dropped once: O(1) a request on average)."""
        idle = self._idle.get((origin.scheme, origin.host, origin.port))
        if not idle:
            return None
        now = time.monotonic()
        while idle and now - idle[0][1] > self._keepalive_expiry:
            oldest, _ = idle.popleft()
            await self._discard(oldest)
        while idle:
            connection, _ = idle.pop()
            if connection.is_idle() and not connection.has_expired():  # asks the kernel about this one only
                return connection
            await self._discard(connection)
        return None

    def _connect(self, origin: httpcore.Origin) -> httpcore.AsyncHTTPConnection:
        """A new connection, opened by the request it is given (with that request's connect deadline)."""
        if origin.scheme == b"https" and self._ssl_context is None:
            self._ssl_context = httpx.create_ssl_context(trust_env=False)
        connection = httpcore.AsyncHTTPConnection(
            origin,
            ssl_context=self._ssl_context,
            keepalive_expiry=self._keepalive_expiry,
            http1=True,
            http2=False,
            network_backend=_SOCKETS,
        )
        self._open.add(connection)
        return connection

    async def _discard(self, connection: httpcore.AsyncHTTPConnection) -> None:
        self._open.discard(connection)
        if not connection.is_closed():
            with anyio.CancelScope(shield=True):  # anyio's cancellation only (see the module's docstring)
                await connection.aclose()

    async def release(self, connection: httpcore.AsyncHTTPConnection, origin: httpcore.Origin) -> None:
        """A request's answer was read or closed: its connection goes back (if reusable), and its slot."""
        try:
            idle = self._idle.setdefault((origin.scheme, origin.host, origin.port), deque())
            if connection.is_idle() and len(idle) < self._max_idle:
                idle.append((connection, time.monotonic()))
            else:
                await self._discard(connection)
        finally:
            self._slots.release()

    async def aclose(self) -> None:
        self._idle.clear()
        connections, self._open = self._open, set()
        for connection in connections:
            await self._discard(connection)

    async def __aenter__(self) -> UpstreamPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class _ReleasingStream:
    """An answer's body; closing it (read to the end or not) gives its connection back to the pool."""

    def __init__(
        self, stream: Any, pool: UpstreamPool, connection: httpcore.AsyncHTTPConnection, origin: httpcore.Origin
    ) -> None:
        self._stream, self._pool, self._connection, self._origin = stream, pool, connection, origin
        self._closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for part in self._stream:
                yield part
        except BaseException:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        # The shield holds off anyio's cancellation only: asyncio's may still cut the close short at
        # its first await, and then ``finally`` gives the connection (not idle: discarded) and its
        # slot back all the same (see the module's docstring).
        with anyio.CancelScope(shield=True):
            try:
                await self._stream.aclose()  # an answer not read to the end closes its connection
            finally:
                await self._pool.release(self._connection, self._origin)


class UpstreamTransport(httpx.AsyncHTTPTransport):
    """httpx's transport (its request and response wrapping, its mapping of httpcore's errors) on
    :class:`UpstreamPool`."""

    def __init__(self, limits: httpx.Limits) -> None:  # not super's: it would build httpcore's pool
        unbounded = 1 << 30  # httpx's None: no limit
        self._pool = UpstreamPool(  # type: ignore[assignment]
            max_connections=unbounded if limits.max_connections is None else limits.max_connections,
            max_keepalive_connections=unbounded
            if limits.max_keepalive_connections is None
            else limits.max_keepalive_connections,
            keepalive_expiry=float("inf") if limits.keepalive_expiry is None else limits.keepalive_expiry,
        )
