"""The part of the client that does no I/O, shared by the sync and the asyncio client: settings,
request building, the retry policy, and the retry loop written once as a generator.

The loop (:func:`attempts`) yields what to do next, an ``httpx.Request`` to send or a
:class:`Sleep`; a driver (``_drivers.run_sync`` / ``_async_drivers.run_async``) does it and sends back
the ``httpx.Response`` (or throws the transport error in). So when to retry, how long to wait and
which error to raise are decided in one place for both clients and for the feedback batcher.
"""

from __future__ import annotations

import email.utils
import ipaddress
import json
import math
import os
import random
import time
import uuid
import warnings
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime
from typing import Any, Callable, Generic, Optional, TypeVar, Union

import httpx

from strop._exceptions import (
    APIResponseValidationError,
    StropError,
    error_from_response,
    error_from_transport,
    mask_key,
)
from strop._version import __version__

T = TypeVar("T")

DEFAULT_BASE_URL = "http://127.0.0.1:8000"
DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=5.0)
DEFAULT_MAX_RETRIES = 2

# Statuses that say "not done, come back later". 500 is not here: it is a bug, and the same request
# would fail the same way.
RETRY_STATUSES = frozenset({429, 502, 503, 504})
# Of those, the ones Strop answers before doing any work (the rate limit is checked before the view
# runs; a 503 means vLLM did not answer, so nothing was served or recorded). Only these are retried
# for a completion once it was sent: a 502 or 504 may come from a proxy after Strop served it.
RETRY_STATUSES_UNSENT_WORK = frozenset({429, 503})
# Transport errors raised before any byte of the request left: safe to retry for every call.
NOT_SENT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


# Headers whose values are credentials: shown masked, as the API key is.
_SECRET_HEADERS = frozenset({"authorization", "proxy-authorization", "api-key", "x-api-key", "cookie"})


class InsecureBaseURLWarning(UserWarning):
    """The client was given an ``http://`` base URL whose host is not this machine: the API key
    would cross the network unencrypted."""


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` is this machine: ``localhost``, 127.0.0.0/8 or ::1."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_if_cleartext(base_url: str) -> None:
    """An ``http://`` base URL sends the API key in clear text over the network, unless the host
    is this machine: say so (a warning, since a private network or a sidecar may be what is meant)."""
    url = httpx.URL(base_url)
    if url.scheme == "http" and not is_loopback_host(url.host):
        warnings.warn(
            f"strop: base_url {base_url!r} is plain http:// to a host other than this machine: the API key "
            "and every prompt travel unencrypted. Use https:// (http:// is meant for 127.0.0.1 or localhost).",
            InsecureBaseURLWarning,
            stacklevel=4,
        )


@dataclass(frozen=True)
class ClientConfig:
    """``timeout`` is None when the caller gave none: requests then take the HTTP client's own
    (``DEFAULT_TIMEOUT`` for the one the SDK makes). ``default_headers`` go on every request.
    Its repr shows the API key (and credential headers) masked: a config may be logged."""

    base_url: str
    api_key: str
    timeout: httpx.Timeout | None
    max_retries: int
    default_headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        *,
        base_url: str | None,
        api_key: str | None,
        timeout: float | httpx.Timeout | None,
        max_retries: int,
        default_headers: Mapping[str, str] | None = None,
    ) -> ClientConfig:
        base_url = base_url or os.environ.get("STROP_BASE_URL") or DEFAULT_BASE_URL
        api_key = api_key or os.environ.get("STROP_API_KEY")
        if not api_key:
            raise StropError("no API key: pass api_key= or set STROP_API_KEY")
        if max_retries < 0:
            raise ValueError("max_retries must be 0 or more")
        if timeout is not None and not isinstance(timeout, httpx.Timeout):
            timeout = httpx.Timeout(float(timeout), connect=min(float(timeout), 5.0))
        warn_if_cleartext(base_url)
        return cls(
            base_url=base_url.rstrip("/"),
            api_key=api_key,
            timeout=timeout,
            max_retries=max_retries,
            default_headers=dict(default_headers or {}),
        )

    def __repr__(self) -> str:
        headers = {
            name: ("***" if name.lower() in _SECRET_HEADERS else value) for name, value in self.default_headers.items()
        }
        return (
            f"ClientConfig(base_url={self.base_url!r}, api_key={mask_key(self.api_key)!r}, timeout={self.timeout!r}, "
            f"max_retries={self.max_retries!r}, default_headers={headers!r})"
        )

    @property
    def http_timeout(self) -> httpx.Timeout:
        """The timeout of an HTTP client the SDK makes itself."""
        return self.timeout or DEFAULT_TIMEOUT

    def headers(self, *, is_async: bool) -> httpx.Headers:
        """Ours, then the caller's ``default_headers`` over them, whatever their case (a proxy may
        want its own ``Authorization``, a product its own ``User-Agent``)."""
        headers = httpx.Headers(
            {
                "Authorization": f"Bearer {self.api_key}",
                "Accept": "application/json",
                "User-Agent": f"strop-python/{__version__}{' async' if is_async else ''}",
            }
        )
        headers.update(self.default_headers)
        return headers


def merge_headers(base: Mapping[str, str], extra: Mapping[str, str] | None) -> dict[str, str]:
    """``base`` with ``extra`` over it; names compare without case, as HTTP's do, and keep the
    spelling they were given."""
    merged = dict(base)
    for name, value in (extra or {}).items():
        for same in [key for key in merged if key.lower() == name.lower()]:
            del merged[same]
        merged[name] = value
    return merged


# ---- JSON ----


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def encode_json(value: Any) -> bytes:
    """Compact JSON; datetimes as ISO 8601, UUIDs as strings. NaN and Infinity are refused here,
    in the caller, as the API would refuse them."""
    return json.dumps(value, default=_json_default, allow_nan=False, separators=(",", ":"), ensure_ascii=False).encode()


def without_none(**fields: Any) -> dict[str, Any]:
    return {key: value for key, value in fields.items() if value is not None}


# ---- calls ----


@dataclass(frozen=True)
class Call(Generic[T]):
    """One API call, described: the request to build, how to read its answer, and whether the
    server may see it twice (``idempotent``; a completion is not). ``headers`` are this call's
    own (over the client's)."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: Mapping[str, Any] | None = None
    body: Any = None
    content: bytes | None = None
    idempotent: bool = True
    stream: bool = False
    headers: Mapping[str, str] | None = None

    def build(self, config: ClientConfig, http: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        """The request, built by ``http`` so that its own settings (headers, cookies, timeout)
        apply; ours are added on top."""
        headers = config.headers(is_async=isinstance(http, httpx.AsyncClient))
        if self.stream:
            headers["Accept"] = "text/event-stream, application/json"  # errors come as JSON
        headers.update(self.headers or {})
        content = self.content
        if content is None and self.body is not None:
            content = encode_json(self.body)
        if content is not None:
            headers["Content-Type"] = "application/json"
        params = {k: _param(v) for k, v in (self.params or {}).items() if v is not None}
        extra: dict[str, Any] = {} if config.timeout is None else {"timeout": config.timeout}
        return http.build_request(
            self.method, config.base_url + self.path, params=params or None, content=content, headers=headers, **extra
        )


def _param(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def read_json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        raise APIResponseValidationError(
            f"the API answered {response.status_code} with a body that is not JSON: {response.text[:200]!r}",
            response=response,
            body=response.text,
        ) from None


# ---- retries ----


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with jitter; ``Retry-After`` honoured up to ``max_retry_after`` seconds.
    A longer ``Retry-After`` is not waited for: the error is raised at once (it carries
    ``retry_after``), so no call blocks for minutes unannounced."""

    max_retries: int = DEFAULT_MAX_RETRIES
    initial_delay: float = 0.5
    max_delay: float = 8.0
    max_retry_after: float = 60.0

    def backoff(self, attempt: int) -> float:
        """The wait after failed attempt ``attempt`` (0-based): half to all of min(initial·2^n, max)."""
        ceiling: float = min(self.initial_delay * (2.0**attempt), self.max_delay)
        return ceiling * (0.5 + random.random() / 2)

    def delay(self, attempt: int, retry_after: float | None) -> float | None:
        """Seconds to wait before the next attempt, or None when there is none."""
        if attempt >= self.max_retries:
            return None
        if retry_after is not None:
            return retry_after if retry_after <= self.max_retry_after else None
        return self.backoff(attempt)


def parse_retry_after(headers: httpx.Headers) -> float | None:
    """``Retry-After`` in seconds (a number or an HTTP date); None when absent or unreadable."""
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            parsed = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):  # not a date either (3.9 raises TypeError, later ValueError)
            return None
        if parsed is None:
            return None
        seconds = parsed.timestamp() - time.time()
    if not math.isfinite(seconds):
        return None
    return max(0.0, seconds)


@dataclass(frozen=True)
class Sleep:
    seconds: float


Step = Union[httpx.Request, Sleep]
Attempts = Generator[Step, Optional[httpx.Response], httpx.Response]
# What a driver (``_async_drivers`` / ``_drivers``) runs: ``attempts``, or a generator around it.
Steps = Generator[Step, Optional[httpx.Response], T]


def attempts(
    request: httpx.Request,
    policy: RetryPolicy,
    *,
    idempotent: bool,
    deadline: Callable[[], float | None] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Attempts:
    """Send ``request`` until it succeeds or the policy says stop; returns the successful response
    (a 2xx or 3xx) and raises the typed error of the last failure.

    ``deadline()`` (monotonic seconds, or None) bounds the waiting: a retry that would come after
    it is not made. The batcher sets it when it is closed; a sleep cut short (the driver may wake
    early) resumes until its time unless the deadline has come before it.
    """
    attempt = 0
    while True:
        try:
            response = yield request
            assert response is not None
        except httpx.TransportError as exc:
            error: StropError = error_from_transport(exc, request)
            retryable = idempotent or isinstance(exc, NOT_SENT_ERRORS)
            if isinstance(exc, (httpx.UnsupportedProtocol, httpx.LocalProtocolError)):
                retryable = False  # the request itself is wrong: it would fail the same way
            wait = policy.delay(attempt, None) if retryable else None
            if wait is None:
                raise error from exc
        else:
            if response.status_code < 400:
                return response
            retry_after = parse_retry_after(response.headers)
            error = error_from_response(response, retry_after=retry_after)
            statuses = RETRY_STATUSES if idempotent else RETRY_STATUSES_UNSENT_WORK
            # The server may say waiting will not help (a call costing more than the tenant's whole
            # limit): the header OpenAI's clients read before retrying.
            never = response.headers.get("x-should-retry") == "false"
            wait = policy.delay(attempt, retry_after) if response.status_code in statuses and not never else None
            if wait is None:
                raise error
        wake_at = clock() + wait
        while (now := clock()) < wake_at:
            limit = deadline() if deadline is not None else None
            if limit is not None and limit < wake_at:
                raise error  # the next retry would come after the deadline
            yield Sleep(wake_at - now)
        attempt += 1
