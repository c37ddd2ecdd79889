"""vLLM's server-sent events as both clients read them (apps/engines/vllm_types.py): lines split
where the SSE format ends one, whatever the chunks' boundaries."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest

from apps.engines.vllm_types import VLLMError, aread_sse_json, read_sse_json

# Raw in vLLM's JSON (pydantic writes non-ASCII unescaped); str.splitlines breaks a line at each.
LINE_BREAKS_IN_TEXT = "a\u2028b\u2029c\x85d é"


def _wire(texts: list[str], *, newline: str = "\n") -> bytes:
    events = [
        json.dumps({"choices": [{"text": t, "logprobs": {"token_logprobs": [float("-inf")]}}]}, ensure_ascii=False)
        for t in texts
    ]
    return "".join(f"data: {e}{newline}{newline}" for e in [*events, "[DONE]"]).encode()


def _chunks(wire: bytes, size: int) -> list[bytes]:
    return [wire[i : i + size] for i in range(0, len(wire), size)]


def _sync_events(chunks: list[bytes], got: list[dict] | None = None) -> list[dict]:
    """The events read from ``chunks``, each also put in ``got`` as it comes."""
    got = [] if got is None else got
    for event in read_sse_json(httpx.Response(200, content=iter(chunks)), "r"):
        got.append(event)
    return got


def _async_events(chunks: list[bytes], got: list[dict] | None = None) -> list[dict]:
    """:func:`_sync_events` through the asynchronous reader."""
    got = [] if got is None else got

    async def body() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk

    async def read() -> None:
        async for event in aread_sse_json(httpx.Response(200, content=body()), "r"):
            got.append(event)

    asyncio.run(read())
    return got


@pytest.mark.parametrize("read", [_sync_events, _async_events])
@pytest.mark.parametrize("size", [1, 3, 7, 4096])
@pytest.mark.parametrize("newline", ["\n", "\r\n", "\r"])
def test_a_token_holding_unicode_line_breaks_arrives_whole_at_any_chunking(read, size, newline):
    events = read(_chunks(_wire([LINE_BREAKS_IN_TEXT, "next"], newline=newline), size))

    assert [e["choices"][0]["text"] for e in events] == [LINE_BREAKS_IN_TEXT, "next"]
    assert events[0]["choices"][0]["logprobs"]["token_logprobs"] == [float("-inf")]  # vLLM's -Infinity


@pytest.mark.parametrize("read", [_sync_events, _async_events])
def test_events_before_an_error_event_are_read_and_the_error_raises(read):
    wire = _wire(["one"]).replace(b"data: [DONE]", b'data: {"error": {"message": "engine died"}}')
    got: list[dict] = []

    with pytest.raises(VLLMError, match="engine died"):
        read([wire], got)
    assert [e["choices"][0]["text"] for e in got] == ["one"]


def test_a_last_line_without_its_newline_is_still_read():
    wire = _wire(["one"]).replace(b"data: [DONE]\n\n", b"") + b'data: {"choices": []}'

    assert [len(e["choices"]) for e in _sync_events([wire])] == [1, 0]
    assert [len(e["choices"]) for e in _async_events([wire])] == [1, 0]
