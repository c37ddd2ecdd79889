"""The upstream pool's sockets: httpcore's network backend on asyncio's own transports.

httpcore's default backend on asyncio is anyio's, which opens a cancel scope with a deadline
(``anyio.fail_after``) around every read: some twenty a streamed completion, 7 % of an API
process's CPU at 64 streams at once (py-spy, 2026-11-28). Here a connection is an
:class:`asyncio.Protocol`: the event loop hands it the bytes as they come, a read takes what is
buffered without suspending, and a deadline is a timer only when a read has to wait. What httpcore
and httpx see is the same: ``read`` / ``write`` / ``aclose`` / ``start_tls`` / ``get_extra_info``,
and httpcore's own errors (``ConnectError``, ``ConnectTimeout``, ``ReadError``, ``ReadTimeout``,
``WriteError``, ``WriteTimeout``), each raised from the OS error under it, which httpx maps to its
own as before.

Addresses: a host name's addresses are tried one after another within the connect deadline (anyio
raced them); name each replica by an address or a name with one record (docs/operate.md's replicas).

Flow: reading pauses while ``HIGH_WATER`` bytes wait unread (a caller that reads slowly never
makes the buffer grow without bound); a write waits for the transport to drain below its own high
water mark, within the write deadline.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Iterable
from typing import Any

import httpcore
from httpcore._backends.base import SOCKET_OPTION  # the type of httpcore's socket options
from httpcore._utils import is_socket_readable

HIGH_WATER = 256 * 1024  # bytes buffered unread before the socket is no longer read


class _Connection(asyncio.Protocol):
    """One TCP connection's state: bytes received and not yet read, the end (and its error), and
    the one read or write waiting on it (httpcore never reads or writes a connection twice at once)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.ended = False  # the peer ended or the connection was lost
        self.error: BaseException | None = None  # why it was lost, when not cleanly
        self.reading_paused = False
        self.writing_paused = False
        self.read_waiter: asyncio.Future[None] | None = None
        self.drain_waiter: asyncio.Future[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) >= HIGH_WATER and not self.reading_paused and self.transport is not None:
            self.reading_paused = True
            self.transport.pause_reading()
        self._wake_reader()

    def eof_received(self) -> bool:
        self.ended = True
        self._wake_reader()
        return False  # the transport closes itself: HTTP/1.1 never writes after the peer's end

    def connection_lost(self, exc: Exception | None) -> None:
        self.ended = True
        if exc is not None and self.error is None:
            self.error = exc
        self._wake_reader()
        self._wake_writer()

    def pause_writing(self) -> None:
        self.writing_paused = True

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._wake_writer()

    def _wake_reader(self) -> None:
        waiter, self.read_waiter = self.read_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _wake_writer(self) -> None:
        waiter, self.drain_waiter = self.drain_waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def take(self, max_bytes: int) -> bytes:
        data = bytes(self.buffer[:max_bytes])
        del self.buffer[:max_bytes]
        if self.reading_paused and len(self.buffer) < HIGH_WATER // 2 and self.transport is not None:
            self.reading_paused = False
            self.transport.resume_reading()
        return data

    async def wait(self, waiter: asyncio.Future[None], timeout: float | None) -> bool:
        """Wait for ``waiter``; False if ``timeout`` seconds passed first."""
        if timeout is None:
            await waiter
            return True
        expired = False

        def expire() -> None:
            nonlocal expired
            if not waiter.done():
                expired = True
                waiter.set_result(None)

        timer = self._loop.call_later(max(0.0, timeout), expire)
        try:
            await waiter
        finally:
            timer.cancel()
        return not expired


class AsyncioStream(httpcore.AsyncNetworkStream):
    """One connection (plain, or TLS once :meth:`start_tls` returned the stream that carries it)."""

    def __init__(self, transport: asyncio.Transport, state: _Connection) -> None:
        self._transport, self._state = transport, state

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        state = self._state
        while not state.buffer:
            if state.ended:
                if state.error is not None:
                    raise httpcore.ReadError(str(state.error) or type(state.error).__name__) from state.error
                return b""  # the peer's clean end: httpcore reads it as the connection closed
            waiter = state.read_waiter = state._loop.create_future()
            if not await state.wait(waiter, timeout):
                state.read_waiter = None
                raise httpcore.ReadTimeout(f"no data in {timeout} s")
        return state.take(max_bytes)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        state = self._state
        if state.ended or self._transport.is_closing():
            raise httpcore.WriteError(str(state.error or "the connection is closed")) from state.error
        self._transport.write(buffer)
        deadline = None if timeout is None else state._loop.time() + timeout  # one deadline for the whole write
        while state.writing_paused and not state.ended:
            waiter = state.drain_waiter = state._loop.create_future()
            left = None if deadline is None else deadline - state._loop.time()
            if not await state.wait(waiter, left):
                state.drain_waiter = None
                raise httpcore.WriteTimeout(f"could not write in {timeout} s")
        if state.error is not None:
            raise httpcore.WriteError(str(state.error)) from state.error

    async def aclose(self) -> None:
        # No await before the close: a cancelled caller still closes the socket (vLLM then stops).
        # A read after it (or waiting meanwhile) is an error, never the peer's clean end.
        if self._state.error is None:
            self._state.error = ConnectionAbortedError("the connection was closed here")
        self._transport.abort()

    async def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.AsyncNetworkStream:
        loop = self._state._loop
        try:
            async with asyncio.timeout(timeout):
                transport = await loop.start_tls(
                    self._transport, self._state, ssl_context, server_hostname=server_hostname
                )
        except TimeoutError as exc:
            self._transport.abort()
            raise httpcore.ConnectTimeout(f"TLS handshake not done in {timeout} s") from exc
        except (OSError, ssl.SSLError, ConnectionError) as exc:
            self._transport.abort()
            raise httpcore.ConnectError(str(exc) or type(exc).__name__) from exc
        if transport is None:  # the connection closed during the handshake
            self._transport.abort()
            raise httpcore.ConnectError("the connection closed during the TLS handshake")
        self._state.transport = transport  # type: ignore[assignment]  # pausing reads pauses the TLS layer too
        return AsyncioStream(transport, self._state)  # type: ignore[arg-type]

    def get_extra_info(self, info: str) -> Any:
        if info == "ssl_object":
            return self._transport.get_extra_info("ssl_object")
        if info == "client_addr":
            return self._transport.get_extra_info("sockname")
        if info == "server_addr":
            return self._transport.get_extra_info("peername")
        if info == "socket":
            return self._transport.get_extra_info("socket")
        if info == "is_readable":
            # Bytes (or the end) the loop already took count as well as what the kernel holds: an
            # idle connection is readable only once the server closed it (httpcore's test).
            state = self._state
            return bool(state.buffer) or state.ended or is_socket_readable(self._transport.get_extra_info("socket"))
        return None


class AsyncioBackend(httpcore.AsyncNetworkBackend):
    """What :class:`httpcore.AsyncHTTPConnection` opens its connections with (``network_backend``)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout):
                transport, state = await loop.create_connection(
                    lambda: _Connection(loop),
                    host,
                    port,
                    local_addr=(local_address, 0) if local_address else None,
                )
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"no connection to {host}:{port} in {timeout} s") from exc
        except OSError as exc:
            # anyio's words, without asyncio's (which name the address: it must never reach a tenant);
            # the OS error stays the cause, which the operator's log names (vllm_async._reason).
            raise httpcore.ConnectError("All connection attempts failed") from exc
        sock = transport.get_extra_info("socket")
        try:
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # as anyio's: a request's head goes at once
                for option in socket_options or ():
                    sock.setsockopt(*option)
        except OSError as exc:
            transport.abort()
            raise httpcore.ConnectError(f"socket option refused: {exc}") from exc
        return AsyncioStream(transport, state)

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[SOCKET_OPTION] | None = None
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.UnsupportedProtocol("vLLM replicas are reached over TCP")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
