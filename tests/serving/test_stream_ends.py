"""A stream always ends as OpenAI's clients expect (an error event, then ``[DONE]``), whatever
fails on Strop's side once it has started: the record of what it served, or a bug."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import psycopg
import pytest
from django.db.utils import OperationalError

from apps.serving.answers import sse_response


def _events(bodies: AsyncIterator[dict]) -> list:
    async def read() -> list[bytes]:
        return [part async for part in sse_response(bodies).streaming_content]

    parts = b"".join(asyncio.run(read())).decode().split("\n\n")
    assert parts[-1] == ""
    events = [e.removeprefix("data: ") for e in parts[:-1]]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def _unreachable() -> OperationalError:
    exc = OperationalError("server closed the connection unexpectedly")
    exc.__cause__ = psycopg.OperationalError("server closed the connection unexpectedly")  # sqlstate None
    return exc


@pytest.mark.parametrize(
    ("failure", "code"), [(_unreachable, "service_unavailable"), (lambda: KeyError("bug"), "server_error")]
)
@pytest.mark.parametrize("when", ["at_its_end", "as_it_is_closed"])
def test_a_stream_whose_record_fails_still_ends_with_an_error_event_then_done(failure, code, when):
    async def bodies() -> AsyncIterator[dict]:
        try:
            yield {"choices": [{"index": 0, "text": "return 1"}]}
            if when == "at_its_end":
                raise failure()
        finally:
            if when == "as_it_is_closed":
                raise failure()

    if when == "as_it_is_closed":
        # Closed while suspended after its last body: as a stream closes its upstream when it stops early.
        async def stopping() -> AsyncIterator[dict]:
            inner = bodies()
            try:
                yield await inner.__anext__()
            finally:
                await inner.aclose()

        events = _events(stopping())
    else:
        events = _events(bodies())
    assert events[0] == {"choices": [{"index": 0, "text": "return 1"}]}
    assert events[1]["error"]["code"] == code and events[1]["error"]["message"]
    assert events[2] == "[DONE]" and len(events) == 3


def test_a_stream_that_ends_well_has_no_error_event():
    async def bodies() -> AsyncIterator[dict]:
        yield {"choices": []}

    assert _events(bodies()) == [{"choices": []}, "[DONE]"]
