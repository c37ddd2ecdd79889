"""The asynchronous client's keep-alive pool (apps/engines/vllm_pool.py) against a small HTTP/1.1
server on a real socket: reuse, the pool's deadline, streams closed early, connections the server
closed, cancellation; the asynchronous vLLM client's failures through it; and no free connection in
a process's pool (either client's) as a busy process, never a dead replica."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from apps.common.exceptions import ServerBusy
from apps.engines import vllm_transport
from apps.engines.vllm_async import AsyncVLLMClient
from apps.engines.vllm_client import VLLMClient
from apps.engines.vllm_errors import VLLMUnavailable
from apps.engines.vllm_pool import UpstreamPool, UpstreamTransport
from apps.engines.vllm_transport import async_http_close
from apps.serving.async_views import error_response


@dataclass
class Upstream:
    """What the server saw: connections opened, and streams whose client left before the end."""

    url: str
    connections: int = 0
    streams_left: int = 0
    writers: list[asyncio.StreamWriter] = field(default_factory=list)


def _completion() -> dict[str, Any]:
    choice = {"index": 0, "text": " t", "token_ids": [7], "logprobs": {"token_logprobs": [-0.5]}}
    return {"id": "cmpl-1", "model": "m", "choices": [choice]}


async def _serve(upstream: Upstream, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """``POST /sse?n`` (or a completion asked to stream ``max_tokens``): n events 20 ms apart, then
    usage and [DONE]; ``/silent...``: nothing; ``/close``: an answer, then the connection closed by
    the server; anything else: a whole answer."""
    upstream.connections += 1
    upstream.writers.append(writer)
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode().split("\r\n")
            path = lines[0].split()[1]
            length = next((int(h.split(":")[1]) for h in lines if h.lower().startswith("content-length")), 0)
            body = json.loads(await reader.readexactly(length) or b"{}")
            if path.startswith("/silent"):
                await asyncio.sleep(3600)
            events = int(path.split("?")[1]) if path.startswith("/sse") else body.get("stream") and body["max_tokens"]
            if events:
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n")
                writer.write(b"transfer-encoding: chunked\r\n\r\n")
                try:
                    for _ in range(events):
                        event = f"data: {json.dumps(_completion())}\n\n".encode()
                        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                        await writer.drain()
                        await asyncio.sleep(0.02)
                    for event in (b'data: {"id": "cmpl-1", "choices": [], "usage": {}}\n\n', b"data: [DONE]\n\n"):
                        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                    writer.write(b"0\r\n\r\n")
                    await writer.drain()
                except ConnectionError:
                    upstream.streams_left += 1
                    return
                continue
            answer = json.dumps(_completion()).encode()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n")
            writer.write(b"content-length: %d\r\n\r\n" % len(answer))
            writer.write(answer)
            await writer.drain()
            if path.startswith("/close"):
                writer.close()
                return
    except (asyncio.IncompleteReadError, ConnectionError):
        return


@asynccontextmanager
async def upstream_server() -> AsyncIterator[Upstream]:
    upstream = Upstream(url="")
    server = await asyncio.start_server(lambda r, w: _serve(upstream, r, w), "127.0.0.1", 0)
    upstream.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield upstream
    finally:
        server.close()
        for writer in upstream.writers:
            writer.close()


def _client(max_connections: int = 8) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=4, keepalive_expiry=30)
    return httpx.AsyncClient(transport=UpstreamTransport(limits), trust_env=False)


def _pool(client: httpx.AsyncClient) -> UpstreamPool:
    return client._transport._pool  # type: ignore[attr-defined,no-any-return]


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 30))


def test_answers_read_to_the_end_reuse_one_connection():
    async def scenario() -> None:
        async with upstream_server() as upstream, _client() as http:
            for path in ("/json", "/sse?3", "/json", "/sse?2"):
                async with http.stream("POST", upstream.url + path, json={}) as response:
                    await response.aread()
            assert upstream.connections == 1
            assert _pool(http)._slots._value == 8  # every slot given back

    run(scenario)


def test_a_stream_closed_early_closes_its_connection_and_the_server_sees_the_client_leave():
    async def scenario() -> None:
        async with upstream_server() as upstream, _client() as http:
            async with http.stream("POST", upstream.url + "/sse?100", json={}) as response:
                async for _ in response.aiter_lines():
                    break
            for _ in range(100):
                if upstream.streams_left:
                    break
                await asyncio.sleep(0.02)
            assert upstream.streams_left == 1
            await (await http.post(upstream.url + "/json", json={})).aread()
            assert upstream.connections == 2  # the cut one was not reused
            assert _pool(http)._slots._value == 8

    run(scenario)


def test_a_connection_the_server_closed_while_idle_is_replaced_without_an_error():
    async def scenario() -> None:
        async with upstream_server() as upstream, _client() as http:
            assert (await http.post(upstream.url + "/close", json={})).status_code == 200
            await asyncio.sleep(0.1)  # the server's close reaches this side
            assert (await http.post(upstream.url + "/json", json={})).status_code == 200
            assert upstream.connections == 2

    run(scenario)


def test_the_wait_for_a_free_connection_is_bounded_by_the_pool_deadline():
    async def scenario() -> None:
        async with upstream_server() as upstream, _client(max_connections=1) as http:
            async with http.stream("POST", upstream.url + "/sse?100", json={}):
                started = time.monotonic()
                with pytest.raises(httpx.PoolTimeout):
                    await http.post(upstream.url + "/json", json={}, timeout=httpx.Timeout(5.0, pool=0.3))
                assert 0.25 < time.monotonic() - started < 2.0
            assert (await http.post(upstream.url + "/json", json={})).status_code == 200  # the slot came back

    run(scenario)


def test_a_refused_connection_fails_at_once_and_gives_its_slot_back():
    async def scenario() -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]  # closed on exit: nothing listens there
        async with _client() as http:
            started = time.monotonic()
            with pytest.raises(httpx.ConnectError):
                await http.post(f"http://127.0.0.1:{port}/json", json={})
            assert time.monotonic() - started < 1.0
            assert _pool(http)._slots._value == 8 and not _pool(http)._open

    run(scenario)


def test_a_request_cancelled_before_its_answer_closes_its_connection_and_gives_its_slot_back():
    async def scenario() -> None:
        async with upstream_server() as upstream, _client() as http:
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.2):
                    await http.post(upstream.url + "/silent", json={})
            assert _pool(http)._slots._value == 8 and not _pool(http)._open
            with pytest.raises(httpx.ReadTimeout):  # and the read deadline is httpx's timeout
                await http.post(upstream.url + "/silent", json={}, timeout=0.2)
            assert _pool(http)._slots._value == 8 and not _pool(http)._open

    run(scenario)


def test_the_async_client_streams_through_the_pool_and_fails_over_from_a_refusing_replica():
    async def scenario() -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
        async with upstream_server() as upstream:
            client = AsyncVLLMClient([dead, upstream.url], api_key="")
            client._next = itertools.repeat(0)  # type: ignore[assignment]  # the dead replica first
            stream = await client.stream(model="m", prompt="x", max_tokens=4)
            chunks = [chunk async for chunk in stream]
            assert [len(c.choices) for c in chunks] == [1, 1, 1, 1, 0]
            assert {c.replica for c in chunks} == {upstream.url}
            assert (await client.complete(model="m", prompt="x")).choice.token_ids == [7]
            with pytest.raises(VLLMUnavailable, match="did not answer in time"):
                silent = AsyncVLLMClient([upstream.url + "/silent"], api_key="", timeout=0.3)
                await silent.complete(model="m", prompt="x")
        await async_http_close()

    run(scenario)


def test_streams_read_to_done_keep_their_connection_for_the_next_completion():
    """vLLM's stream ends with ``data: [DONE]`` and then the body's end: the client reads that end
    too, so the connection goes back to the pool instead of being closed as a stream left early
    (every streamed completion would open a new connection to vLLM)."""

    async def scenario() -> None:
        async with upstream_server() as upstream:
            client = AsyncVLLMClient([upstream.url], api_key="")
            for _ in range(3):
                stream = await client.stream(model="m", prompt="x", max_tokens=2)
                assert [len(c.choices) async for c in stream] == [1, 1, 0]
            assert (await client.complete(model="m", prompt="x")).choice.token_ids == [7]
            assert upstream.connections == 1
            assert upstream.streams_left == 0
        await async_http_close()

    run(scenario)


def test_the_synchronous_client_keeps_its_connection_after_a_stream_too(monkeypatch):
    monkeypatch.setattr(vllm_transport, "_http", None)  # a pool of this test's own
    loop, ready, stop = asyncio.new_event_loop(), threading.Event(), threading.Event()
    seen: list[Upstream] = []

    async def serve() -> None:
        async with upstream_server() as upstream:
            seen.append(upstream)
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.02)

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    http = vllm_transport.shared_http()
    try:
        client = VLLMClient([seen[0].url], api_key="", timeout=5)
        for _ in range(3):
            assert [len(c.choices) for c in client.stream(model="m", prompt="x", max_tokens=2)] == [1, 1, 0]
        assert seen[0].connections == 1
    finally:
        http.close()
        stop.set()
        thread.join(10)


def test_a_stream_closed_by_a_cancelled_task_still_closes_its_connection_and_gives_its_slot_back():
    """The close's shield holds off anyio's cancellation only: asyncio's reaches the close's first
    await, and the connection and its slot are given back all the same."""

    async def scenario() -> None:
        async with upstream_server() as upstream, _client() as http:
            task = asyncio.current_task()
            assert task is not None
            with pytest.raises(asyncio.CancelledError):
                async with http.stream("POST", upstream.url + "/sse?100", json={}) as response:
                    async for _ in response.aiter_lines():
                        break
                    task.cancel()  # delivered at the next await: inside the close
            task.uncancel()
            assert _pool(http)._slots._value == 8 and not _pool(http)._open

    run(scenario)


def _home_of(client: AsyncVLLMClient | VLLMClient, replica: str) -> str:
    return next(t for t in (f"tenant-{n}" for n in range(100)) if client._order(t)[0] == replica)


def _assert_busy_answer(busy: ServerBusy) -> None:
    """What the serving endpoints answer for it (apps.serving.async_views): admission's busy answer."""
    answer = error_response(busy)
    assert answer.status_code == 503 and answer["Retry-After"] == "1"
    error = json.loads(answer.content)["error"]
    assert (error["type"], error["code"], error["param"]) == ("server_error", "server_busy", None)
    assert "127.0.0.1" not in error["message"]  # the replica is the operator's


def test_no_free_connection_in_the_pool_is_busy_and_marks_no_replica_down(monkeypatch):
    monkeypatch.setattr(vllm_transport, "ASYNC_MAX_CONNECTIONS", 1)  # this loop's pool: one connection

    async def scenario() -> None:
        async with upstream_server() as home, upstream_server() as other:
            client = AsyncVLLMClient([home.url, other.url], api_key="", timeout=0.3)
            tenant = _home_of(client, home.url)
            held = await client.stream(model="m", prompt="x", max_tokens=100, affinity=tenant)  # the one connection
            started = time.monotonic()
            with pytest.raises(ServerBusy) as busy:
                await client.complete(model="m", prompt="x", affinity=tenant)
            assert 0.25 < time.monotonic() - started < 2.0  # the pool's deadline, then at once
            assert client._order(tenant)[0] == home.url  # not marked down: still the tenant's first
            assert other.connections == 0  # the pool is every replica's: no other was tried
            _assert_busy_answer(busy.value)
            await held.aclose()
            assert (await client.complete(model="m", prompt="x", affinity=tenant)).replica == home.url
        await async_http_close()

    run(scenario)


class _CompletionHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
        self.rfile.read(int(self.headers["Content-Length"]))
        body = json.dumps(_completion()).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_the_synchronous_client_is_busy_too_when_its_pool_has_no_free_connection(monkeypatch):
    monkeypatch.setattr(vllm_transport, "SYNC_MAX_CONNECTIONS", 1)
    monkeypatch.setattr(vllm_transport, "_http", None)  # the process's pool, rebuilt with one connection
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), _CompletionHandler) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    home, other = (f"http://127.0.0.1:{server.server_address[1]}" for server in servers)
    http = vllm_transport.shared_http()
    try:
        client = VLLMClient([home, other], api_key="", timeout=0.3)
        tenant = _home_of(client, home)
        held = http.send(http.build_request("POST", f"{home}/v1/completions", json={}), stream=True)  # unread
        with pytest.raises(ServerBusy) as busy:
            client.complete(model="m", prompt="x", affinity=tenant)
        assert client._order(tenant)[0] == home
        _assert_busy_answer(busy.value)
        held.close()
        assert client.complete(model="m", prompt="x", affinity=tenant).replica == home
    finally:
        http.close()
        for server in servers:
            server.shutdown()
            server.server_close()


@pytest.mark.django_db
def test_the_completion_endpoint_answers_no_free_connection_with_503_server_busy(
    monkeypatch, settings, make_tenant, make_client
):
    from apps.adapters.services import adapter_create, base_model_register
    from apps.interactions.models import Interaction, ServingFailure
    from model_supply.starter import ensure_starter_model

    # No connection to vLLM is ever free in the request's pool (admission keeps its own cap, 2048).
    monkeypatch.setattr(vllm_transport, "ASYNC_MAX_CONNECTIONS", 0)
    requests: list[str] = []

    class Counting(_CompletionHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            requests.append(self.path)
            super().do_POST()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings.VLLM_BASE_URLS = [f"http://127.0.0.1:{server.server_address[1]}"]
    settings.VLLM_TIMEOUT_S = 0.3  # the pool's deadline too
    try:
        base = base_model_register(name="m", path=str(ensure_starter_model("tiny")))
        tenant = make_tenant("busy")
        adapter_create(tenant, name="tab", base_model=base, is_default=True)
        client = make_client(tenant, scopes=["serve"])
        for stream in (False, True):
            response = client.post(
                "/v1/completions", {"model": "tab", "prompt": "x", "max_tokens": 4, "stream": stream}, format="json"
            )
            assert response.status_code == 503 and response["Retry-After"] == "1"
            error = response.json()["error"]
            assert (error["type"], error["code"]) == ("server_error", "server_busy")
            assert "connection to vLLM" in error["message"]  # the pool's answer, not admission's
        assert requests == []  # nothing reached the replica
        assert not Interaction.objects.exists()
        assert not ServingFailure.objects.exists()  # a busy process is no failure of the version
    finally:
        server.shutdown()
        server.server_close()
