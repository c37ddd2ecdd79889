"""The serving sweep's load generator (benchmarks/light_http.py) reads what httpx reads: the mock
vLLM's whole and streamed completions and an error, over one kept-alive connection, and the
three ways HTTP/1.1 frames a body."""

from __future__ import annotations

import asyncio

import httpx
import orjson
import pytest

from benchmarks.light_http import Connection, ProtocolError
from tests.fixtures.serving import MockUpstream


def _events(body: bytes) -> list[dict]:
    lines = [line[len(b"data: ") :] for line in body.split(b"\n") if line.startswith(b"data: ")]
    assert lines[-1] == b"[DONE]"
    return [orjson.loads(line) for line in lines[:-1]]


def test_it_reads_the_mock_vllm_as_httpx_does(mock_upstream: MockUpstream) -> None:
    url = f"{mock_upstream.base_url}/v1/completions"
    whole = {"model": mock_upstream.model, "prompt": "def f(", "max_tokens": 5}
    streamed = {**whole, "stream": True, "stream_options": {"include_usage": True}}

    async def light() -> list:
        connection, headers_seen = Connection(url), []
        try:
            answers = [
                await connection.post("/v1/completions", whole, {}),
                await connection.post("/v1/completions", streamed, {}, on_headers=lambda: headers_seen.append(1)),
                await connection.post("/v1/nothing-here", whole, {}),
            ]
            first = connection.writer
            answers.append(await connection.post("/v1/completions", whole, {}))
            assert connection.writer is first, "the connection was not kept alive"
        finally:
            await connection.close()
        assert headers_seen == [1]
        return answers

    answers = asyncio.run(light())
    with httpx.Client(timeout=60) as http:
        expected = [
            http.post(url, json=whole),
            http.post(url, json=streamed),
            http.post(f"{mock_upstream.base_url}/v1/nothing-here", json=whole),
        ]
    for got, want in zip(answers[:3], expected, strict=True):
        assert got.status == want.status_code
        assert got.headers.get("content-type") == want.headers.get("content-type")
    for got in (answers[0], answers[3]):
        choice = got.json()["choices"][0]  # type: ignore[index]
        assert (choice["text"], choice["token_ids"]) == (
            expected[0].json()["choices"][0]["text"],
            [1000 + i for i in range(5)],
        )
    texts = [e["choices"][0]["text"] for e in _events(answers[1].body) if e["choices"]]
    assert texts == [e["choices"][0]["text"] for e in _events(expected[1].content) if e["choices"]]
    assert texts == [f" t{i}" for i in range(5)]
    assert _events(answers[1].body)[-1]["usage"]["completion_tokens"] == 5
    assert answers[2].status == 404 and answers[2].body == expected[2].content


async def _serve(answers: list[bytes]) -> tuple[asyncio.Server, list[int]]:
    """A server that reads each request and answers the next of ``answers`` raw; the connections
    it was asked on, by request."""
    seen: list[int] = []
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        mine = connections
        while answers:
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(
                next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")).split(b":")[1]
            )
            await reader.readexactly(length)
            seen.append(mine)
            answer = answers.pop(0)
            writer.write(answer)
            await writer.drain()
            if b"Connection: close" in answer or b"Content-Length" not in answer and b"chunked" not in answer:
                break
        writer.close()

    return await asyncio.start_server(handle, "127.0.0.1", 0), seen


def test_each_framing_of_a_body_and_a_server_that_closes() -> None:
    answers = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3;ext=1\r\nabc\r\n2\r\n\r\n\r\n0\r\nX-Trailer: t\r\n\r\n",
        b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
        b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nto the end",
        b"SSH-2.0-OpenSSH\r\n",
    ]

    async def run() -> tuple[list, list[int], Exception]:
        server, seen = await _serve(answers)
        port = server.sockets[0].getsockname()[1]
        connection = Connection(f"http://127.0.0.1:{port}")
        got = [await connection.post("/", {"n": i}, {"X-Key": "k"}) for i in range(4)]
        with pytest.raises(ProtocolError) as refused:
            await connection.post("/", {}, {})
        assert connection.writer is None  # a bad answer closes it
        await connection.close()
        server.close()
        await server.wait_closed()
        return got, seen, refused.value

    got, seen, refused = asyncio.run(run())
    assert [(a.status, a.body) for a in got] == [
        (200, b"hello"),
        (200, b"abc\r\n"),
        (429, b"{}"),
        (200, b"to the end"),
    ]
    assert got[0].headers["x-a"] == "1"
    # Kept alive through the first three; the 429 said close, the HTTP/1.0 answer closed by ending.
    assert seen == [1, 1, 1, 2, 3]
    assert "SSH-2.0" in str(refused)
