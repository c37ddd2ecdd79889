"""A stream whose connection breaks, or stalls past the read timeout, after it started raises the
SDK's own errors (``APIConnectionError`` / ``APITimeoutError``, both ``APIError``s), never a raw
``httpx`` exception. The vLLM behind the real API does not break mid-stream on demand, so the server
here is a plain socket that answers one event and then hangs up or goes quiet."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator

import httpx
import pytest
from strop import APIConnectionError, APIError, APITimeoutError, AsyncStrop, Strop

EVENT = {"id": "cut-1", "object": "text_completion", "choices": [{"index": 0, "text": "return"}]}


@pytest.fixture(params=["broken", "stalled"])
def one_event_server(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(how the stream ends, URL): a server that starts a stream, sends one event, then closes the
    connection (``broken``) or sends nothing more (``stalled``)."""
    how = request.param
    done = threading.Event()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def serve() -> None:
        connection, _ = listener.accept()
        with connection:
            received = b""
            while b"\r\n\r\n" not in received:
                received += connection.recv(65536)
            data = f"data: {json.dumps(EVENT)}\n\n".encode()
            connection.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nX-Request-ID: req-cut\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n" + f"{len(data):x}\r\n".encode() + data + b"\r\n"
            )
            if how == "stalled":
                done.wait(30)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield how, f"http://127.0.0.1:{listener.getsockname()[1]}"
    done.set()
    thread.join(5)
    listener.close()


def expected_error(how: str) -> type[APIError]:
    return APITimeoutError if how == "stalled" else APIConnectionError


def test_a_stream_cut_mid_way_raises_an_api_error(one_event_server):
    how, url = one_event_server
    chunks = []
    with Strop(base_url=url, api_key="strop_x_y", timeout=1.0) as client:
        with pytest.raises(APIError) as caught:
            with client.completions.create(prompt="x = ", stream=True) as stream:
                for chunk in stream:
                    chunks.append(chunk)
    assert [chunk.id for chunk in chunks] == ["cut-1"]  # what came before the cut is still read
    assert type(caught.value) is expected_error(how)
    assert (caught.value.request_id, caught.value.status_code) == ("req-cut", None)
    assert isinstance(caught.value.__cause__, httpx.TransportError)  # the httpx error, kept as the cause


def test_an_async_stream_cut_mid_way_raises_an_api_error(one_event_server):
    how, url = one_event_server

    async def main() -> tuple[list[str], BaseException]:
        chunks: list[str] = []
        async with AsyncStrop(base_url=url, api_key="strop_x_y", timeout=1.0) as client:
            stream = await client.completions.create(prompt="x = ", stream=True)
            try:
                async with stream:
                    async for chunk in stream:
                        chunks.append(chunk.id)
            except APIError as exc:
                return chunks, exc
        raise AssertionError("the stream ended without an error")

    chunks, error = asyncio.run(main())
    assert chunks == ["cut-1"]
    assert type(error) is expected_error(how) and error.request_id == "req-cut"
