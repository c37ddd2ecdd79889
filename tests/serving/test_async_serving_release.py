"""What a serving request holds (the process's slot, the tenant's stream lease, the stream from
vLLM) comes back however the request ends: a client that leaves before its stream starts, a
refusal, a worker stopped past its grace. Under the ASGI server, on the mock upstream, with the
official openai client or a bare socket as the client (as tests/serving/test_async_serving.py)."""

from __future__ import annotations

import os
import signal
import socket
import time
from urllib.parse import urlsplit

import httpx
import openai
import orjson
import redis

from apps.tenants.models import Tenant
from tests.serving.test_async_serving import (  # noqa: F401  (fixtures)
    TOKENS,
    _api,
    _client,
    _recorded,
    _worker_pids,
    fleet,
    pytestmark,
    starter_dir,
)


def _abort_right_after_sending(url: str, key: str, body: dict) -> None:
    """Send a whole request, then hang up before any answer."""
    parts = urlsplit(url)
    payload = orjson.dumps(body)
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode()
    with socket.create_connection((parts.hostname, parts.port), timeout=30) as sock:
        sock.sendall(head + payload)


def test_streams_whose_clients_leave_before_they_start_give_back_their_slot_and_lease(
    fleet,  # noqa: F811
    api_servers,
    settings,
    mock_upstream,
):
    api = _api(
        api_servers, settings, mock_upstream, STROP_SERVING_MAX_STREAMS_PER_TENANT="2", STROP_SERVING_MAX_IN_FLIGHT="2"
    )
    key = fleet("abort")
    tenant = Tenant.objects.get(slug__startswith="abort-")
    leases = redis.Redis.from_url(settings.REDIS_URL)
    for _ in range(12):
        _abort_right_after_sending(api.url, key, {"model": "tab", "prompt": "x", "max_tokens": 400, "stream": True})
    client = _client(api, key)
    deadline = time.monotonic() + 60
    while True:  # the aborted requests are done once the server has seen every client go
        try:
            text = "".join(c.choices[0].text for c in client.completions.create(
                model="tab", prompt="x", max_tokens=2, stream=True
            ))  # fmt: skip
            break
        except (openai.RateLimitError, openai.InternalServerError) as exc:
            assert time.monotonic() < deadline, f"slots or leases never came back: {exc}"
            time.sleep(0.2)
    assert text == "".join(TOKENS[:2])
    deadline = time.monotonic() + 60
    while leases.zcard(f"strop:streams:{tenant.pk}"):
        assert time.monotonic() < deadline, "a stream lease was never returned"
        time.sleep(0.2)
    # Both of the process's slots and both of the tenant's streams are free: two held at once.
    held = [client.completions.create(model="tab", prompt="x", max_tokens=400, stream=True) for _ in range(2)]
    for stream in held:
        next(iter(stream))
        stream.close()


def test_a_stream_longer_than_the_shutdown_grace_is_cut_and_records_what_it_served(
    fleet,  # noqa: F811
    api_servers,
    settings,
    mock_upstream,
):
    """SIGTERM with a stream that would outlive gunicorn's graceful_timeout (6 s here; 400 tokens at
    50 ms take 20 s): the worker cuts it before gunicorn kills the worker, and what it served is
    recorded."""
    api = _api(api_servers, settings, mock_upstream, STROP_API_GRACEFUL_TIMEOUT_S="6")
    (worker,) = _worker_pids(api.proc.pid)
    stream = _client(api, fleet("grace")).completions.create(
        model="tab", prompt="def f():", max_tokens=400, stream=True
    )
    texts = []
    try:
        for chunk in stream:
            texts.append(chunk.choices[0].text)
            if len(texts) == 2:
                os.kill(worker, signal.SIGTERM)
    except (openai.APIError, httpx.HTTPError):
        pass  # cut: the client sees the connection end early
    assert 2 <= len(texts) < 400
    recorded = _recorded(chunk.id)
    served = len(recorded.completion_token_ids)
    assert len(texts) <= served < 400
    assert recorded.completion == "".join(TOKENS[:served])
