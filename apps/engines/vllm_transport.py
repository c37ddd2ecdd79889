"""What the synchronous and the asynchronous vLLM clients share: the replica order, the keep-alive
pools, the timeouts, the key and the body of a completion request.

Plain Python (httpx), no Django models.

- A completion with an ``affinity`` (the tenant) goes to that tenant's home replica, chosen by
  rendezvous hashing, so each replica's LoRA slots hold only its tenants' adapters and adding a
  replica moves only the tenants it takes; without one, round-robin. Either way a completion fails
  over to the next replica only when the connection could not be opened (nothing was sent).
- A replica that refused a connection is tried last for ``REPLICA_COOL_OFF_S`` (per process).
- One ``httpx.Client`` per process (rebuilt after a fork) for the synchronous client, and one
  ``httpx.AsyncClient`` per event loop for the asynchronous one (the serving path), on the pool of
  :mod:`apps.engines.vllm_pool`.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import os
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

import httpx

from apps.engines.vllm_errors import VLLMError
from apps.engines.vllm_pool import UpstreamTransport
from apps.engines.vllm_types import Completion, CompletionChunk, parse_choice, parse_usage, prompt_ids

# A replica that refused a connection is tried last for this long (per process).
REPLICA_COOL_OFF_S = 2.0
_down_until: dict[str, float] = {}

# The asynchronous pool holds a stream per connection. Admission (STROP_SERVING_MAX_IN_FLIGHT, default
# 1024) is capped at this, so an admitted completion never waits for a connection; what is left above the
# default limit is room for an operator who raises it, not a queue.
ASYNC_MAX_CONNECTIONS = 2048
# The synchronous pool serves a process's threads (Celery tasks, the synchronous views, scripts).
SYNC_MAX_CONNECTIONS = 256

_http_lock = threading.Lock()
_http: httpx.Client | None = None
_http_pid: int | None = None
_async_http: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncClient] = weakref.WeakKeyDictionary()


def rendezvous(affinity: str, replica: str) -> bytes:
    """Highest-random-weight hashing: the replica with the largest weight is ``affinity``'s home."""
    return hashlib.blake2b(f"{affinity}\n{replica}".encode(), digest_size=8).digest()


def shared_http() -> httpx.Client:
    """The process's one keep-alive pool; rebuilt after a fork (gunicorn, Celery prefork)."""
    global _http, _http_pid
    pid = os.getpid()
    if _http is None or _http_pid != pid:
        with _http_lock:
            if _http is None or _http_pid != pid:
                limits = httpx.Limits(
                    max_connections=SYNC_MAX_CONNECTIONS, max_keepalive_connections=64, keepalive_expiry=30
                )
                _http = httpx.Client(limits=limits, http1=True, trust_env=False)
                _http_pid = pid
    return _http


def shared_async_http() -> httpx.AsyncClient:
    """The running event loop's keep-alive pool (an API worker has one loop), on
    :class:`apps.engines.vllm_pool.UpstreamTransport`: its bookkeeping per request does not grow
    with the connections it holds, as httpcore's own pool's does."""
    loop = asyncio.get_running_loop()
    client = _async_http.get(loop)
    if client is None:
        limits = httpx.Limits(max_connections=ASYNC_MAX_CONNECTIONS, max_keepalive_connections=512, keepalive_expiry=30)
        client = _async_http[loop] = httpx.AsyncClient(transport=UpstreamTransport(limits), trust_env=False)
    return client


async def async_http_close() -> None:
    """Close the running loop's pool: for a loop made for one request (Django's test client, a
    WSGI server running an asynchronous view), whose connections must not outlive it."""
    client = _async_http.pop(asyncio.get_running_loop(), None)
    if client is not None:
        await client.aclose()


def raise_if_key_refused(response: httpx.Response, replica: str) -> None:
    """401/403 is the operator's mistake (Strop's VLLM_API_KEY is not the one vLLM was started
    with), never the tenant's: a 502 that says so, not vLLM's 4xx passed on as a bad request."""
    if response.status_code in (401, 403):
        raise VLLMError(
            f"vLLM at {replica} refused Strop's API key (HTTP {response.status_code}): "
            "VLLM_API_KEY must be the key vLLM was started with",
            replica=replica,
            vllm_status=response.status_code,
        )


def mark_down(replica: str) -> None:
    _down_until[replica] = time.monotonic() + REPLICA_COOL_OFF_S


LAST_CONNECT_S = 5.0
"""Connect deadline of the last replica to try (``_Transport._timeouts``): long enough for a busy
process to reach its handshakes, short enough that a silent host does not hold a request long."""

class Replicas:
    """The replicas of one base model, the key, the timeouts; what both clients are built on.

    ``connect_timeout`` bounds opening a connection when another replica is left to try (a
    replica that does not answer is left fast for the next one; see :meth:`_timeouts`);
    ``timeout`` bounds the wait for a completion (for a stream: between two chunks);
    ``admin_timeout`` bounds adapter loads and listings. ``api_key``: vLLM's key (None: read
    ``$VLLM_API_KEY``; empty: send none).
    """

    def __init__(
        self,
        base_urls: str | Sequence[str],
        *,
        api_key: str | None = None,
        connect_timeout: float = 1.0,
        timeout: float = 30.0,
        admin_timeout: float = 60.0,
    ) -> None:
        urls = [base_urls] if isinstance(base_urls, str) else list(base_urls)
        if not urls:
            raise ValueError(f"{type(self).__name__} needs at least one base URL")
        self.base_urls = [u.rstrip("/") for u in urls]
        if api_key is None:
            api_key = os.environ.get("VLLM_API_KEY", "")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._connect_timeout = connect_timeout
        self._timeout = timeout
        self._admin_timeout = admin_timeout
        self._next = itertools.count()

    def _timeouts(self, read: float, *, fail_over: bool = True) -> httpx.Timeout:
        """The deadlines of one call; ``fail_over``: another replica is left to try after this one.

        The short connect deadline is there to move on to that replica fast. The last one (one
        replica, or the others tried) gets longer, ``LAST_CONNECT_S`` (or the answer's deadline if
        shorter): the deadline runs on this process's clock, and a process busy with a burst of new
        requests (hundreds of streams opening at once: 2.5 s at the median, 3.4 s at most for 512
        on the 2-core machine) reaches a handshake the kernel finished long ago only after it, and
        would read its own wait as a dead replica. A dead server still fails at once (its
        connection is refused); a host that answers nothing at all costs at most ``LAST_CONNECT_S``.
        Waiting for a free connection in this process's pool is this process's own wait, never the
        replica's, at most as long as the answer; past it the process is busy (503
        ``server_busy``), and no replica is marked down. The serving path never waits there: it
        admits at most as many completions as the pool has connections (apps.serving.admission)."""
        connect = self._connect_timeout if fail_over else max(self._connect_timeout, min(read, LAST_CONNECT_S))
        return httpx.Timeout(connect=connect, read=read, write=10.0, pool=read)

    def _attempts(self, affinity: str | None, read: float) -> list[tuple[str, httpx.Timeout]]:
        """Each replica to try, in order (:meth:`_order`), with its deadlines (:meth:`_timeouts`)."""
        order = self._order(affinity)
        return [(replica, self._timeouts(read, fail_over=i < len(order) - 1)) for i, replica in enumerate(order)]

    def _order(self, affinity: str | None = None) -> list[str]:
        """Replicas in the order to try: by rendezvous hash of ``affinity`` (its home first, the
        same fallback every time), else round-robin from this call's turn. Those that just
        refused a connection go last, so a dead replica costs one connect attempt per cool-off,
        not one per request."""
        if affinity is not None:
            ordered = sorted(self.base_urls, key=lambda url: rendezvous(affinity, url), reverse=True)
        else:
            start = next(self._next) % len(self.base_urls)
            ordered = self.base_urls[start:] + self.base_urls[:start]
        now = time.monotonic()
        return sorted(ordered, key=lambda url: _down_until.get(url, 0.0) > now)


def completion_body(
    *,
    model: str,
    prompt: str | Sequence[int],
    max_tokens: int = 16,
    temperature: float = 1.0,
    top_p: float = 1.0,
    stop: Sequence[str] | None = None,
    n: int = 1,
    seed: int | None = None,
    user: str | None = None,
    extra: dict[str, Any] | None = None,
    logprobs: int = 1,
) -> dict[str, Any]:
    """What vLLM is sent for a completion: always the sampled token ids and their logprobs."""
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt if isinstance(prompt, str) else [int(t) for t in prompt],
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "n": n,
        # At least 1: the sampled token's own logprob is what training needs; a client may
        # want more alternatives (OpenAI allows 5, vLLM 20).
        "logprobs": max(1, int(logprobs or 1)),
        "return_token_ids": True,
    }
    for key, value in (("stop", list(stop) if stop else None), ("seed", seed), ("user", user)):
        if value is not None:
            body[key] = value
    body.update(extra or {})
    return body


def chunk_of(data: dict[str, Any], replica: str) -> CompletionChunk:
    """One server-sent event of a streamed completion as a :class:`CompletionChunk`."""
    raw_choices = data.get("choices") or []
    return CompletionChunk(
        id=str(data.get("id", "")),
        model=str(data.get("model", "")),
        choices=[parse_choice(c, replica) for c in raw_choices],
        prompt_token_ids=prompt_ids(raw_choices),
        usage=parse_usage(data.get("usage")),
        replica=replica,
    )


def completion_of(data: dict[str, Any], model: str, replica: str) -> Completion:
    """A whole completion answer as a :class:`Completion`."""
    raw_choices = data.get("choices") or []
    return Completion(
        id=str(data.get("id", "")),
        model=str(data.get("model", model)),
        choices=[parse_choice(c, replica) for c in raw_choices],
        prompt_token_ids=prompt_ids(raw_choices),
        usage=parse_usage(data.get("usage")),
        replica=replica,
    )
