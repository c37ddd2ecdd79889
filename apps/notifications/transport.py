"""One POST to a tenant's webhook receiver, made so that the receiver cannot hold a worker or reach
past the address guard.

- It connects only to the addresses vetted by ``apps.notifications.addresses`` (resolved once):
  an httpcore network backend ignores the name httpcore asks it to resolve, while the URL keeps the
  name, so TLS (SNI and the certificate check) and the ``Host`` header still name the host.
- One deadline bounds the whole exchange (connect, TLS, request, status line and headers, and what
  is read of the body). httpx's timeouts are per operation, so a receiver that sends a byte every
  few seconds never trips them: here every socket operation gets at most the time left.
- The status is the answer. The body is read up to a cap (and the deadline), then the connection
  is closed: nothing a receiver sends can fill a worker's memory.

Plain values in, plain values out: no Django here.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import httpcore
import httpx

from apps.notifications.addresses import IPAddress


@dataclass(frozen=True)
class PostResult:
    """The receiver's HTTP status (None when there was no complete answer) and what went wrong."""

    status: int | None
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._at = time.monotonic() + seconds

    def bound(self, timeout: float | None, expired: type[Exception]) -> float:
        """``timeout`` cut to the time left; ``expired`` raised when none is."""
        left = self._at - time.monotonic()
        if left <= 0:
            raise expired(f"the deadline of {self.seconds:g} s passed")
        return left if timeout is None else min(timeout, left)


class _DeadlineStream(httpcore.NetworkStream):
    """A connection whose every read, write and TLS handshake ends by the deadline."""

    def __init__(self, stream: httpcore.NetworkStream, deadline: _Deadline) -> None:
        self._stream, self._deadline = stream, deadline

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._stream.read(max_bytes, self._deadline.bound(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._stream.write(buffer, self._deadline.bound(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._stream.close()

    def start_tls(
        self, ssl_context: ssl.SSLContext, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        bounded = self._deadline.bound(timeout, httpcore.ConnectTimeout)
        return _DeadlineStream(self._stream.start_tls(ssl_context, server_hostname, bounded), self._deadline)

    def get_extra_info(self, info: str) -> object:
        return self._stream.get_extra_info(info)


class PinnedBackend(httpcore.NetworkBackend):
    """Connects to the vetted addresses of ``host`` (in order, the first that answers) and never
    resolves a name itself."""

    def __init__(self, *, host: str, addresses: Sequence[IPAddress], deadline: _Deadline) -> None:
        self._host, self._addresses, self._deadline = host, list(addresses), deadline
        self._inner = httpcore.SyncBackend()

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.NetworkStream:
        if host.strip("[]").lower() != self._host:
            raise httpcore.ConnectError("asked to connect to a host that was not vetted")
        failure: Exception = httpcore.ConnectError("no address to connect to")
        for address in self._addresses:
            try:
                stream = self._inner.connect_tcp(
                    str(address),
                    port,
                    timeout=self._deadline.bound(timeout, httpcore.ConnectTimeout),
                    local_address=local_address,
                    socket_options=socket_options,
                )
            except httpcore.ConnectError as exc:
                failure = exc
                continue
            return _DeadlineStream(stream, self._deadline)
        raise failure

    def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[httpcore.SOCKET_OPTION] | None = None
    ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("unix sockets are not webhook receivers")

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def _drain(response: httpcore.Response, max_bytes: int) -> None:
    """Read and drop at most ``max_bytes`` of the body, within what is left of the deadline. The
    status is the answer: a body cut short by the cap, the deadline or the receiver changes nothing
    (closing the response then drops the connection and whatever else was coming)."""
    read = 0
    try:
        for chunk in response.iter_stream():
            read += len(chunk)
            if read >= max_bytes:
                return
    except (httpcore.TimeoutException, httpcore.NetworkError, httpcore.ProtocolError):
        return


def post_pinned(
    url: str,
    *,
    host: str,
    addresses: Sequence[IPAddress],
    body: bytes,
    headers: dict[str, str],
    deadline_s: float,
    max_response_bytes: int,
) -> PostResult:
    """POST ``body`` to ``url`` (whose host is ``host``) through ``addresses`` only, the whole
    exchange within ``deadline_s`` and at most ``max_response_bytes`` of the answer read."""
    deadline = _Deadline(deadline_s)
    timeouts = {"connect": deadline_s, "read": deadline_s, "write": deadline_s, "pool": deadline_s}
    pool = httpcore.ConnectionPool(
        ssl_context=httpx.create_ssl_context(),
        network_backend=PinnedBackend(host=host.lower(), addresses=addresses, deadline=deadline),
        max_connections=1,
        retries=0,
    )
    try:
        with (
            pool,
            pool.stream(
                "POST", url, headers=list(headers.items()), content=body, extensions={"timeout": timeouts}
            ) as response,
        ):
            _drain(response, max_response_bytes)
            return PostResult(status=response.status)
    except httpcore.TimeoutException:
        return PostResult(status=None, error=f"no complete answer within {deadline_s:g} s")
    except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol) as exc:
        message = str(exc) or type(exc).__name__
        for address in addresses:  # the tenant reads this: never show where its name resolved
            message = message.replace(str(address), "the host")
        return PostResult(status=None, error=f"{type(exc).__name__}: {message}")
