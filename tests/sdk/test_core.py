"""The parts of the SDK that do no I/O: the retry decisions and the stream's event parsing."""

from __future__ import annotations

import email.utils
import json
import time

import httpx
import pytest
from strop import APIError, APITimeoutError, RateLimitError, ServiceUnavailableError, StreamError
from strop._core import RetryPolicy, Sleep, attempts, parse_retry_after
from strop._streaming import DONE, ChunkReader

REQUEST = httpx.Request("POST", "http://strop.test/v1/completions")


def answer(status: int, headers: dict[str, str] | None = None) -> httpx.Response:
    body = {"error": {"code": "x", "message": "m", "details": {}}}
    return httpx.Response(status, json=body, headers=headers, request=REQUEST)


def drive(outcomes: list, *, idempotent: bool, policy: RetryPolicy | None = None) -> tuple[list[float], object]:
    """Run the retry loop on a list of answers (responses, or transport errors to throw in);
    returns the sleeps it asked for and what it returned or raised."""
    steps = attempts(REQUEST, policy or RetryPolicy(max_retries=2), idempotent=idempotent)
    sleeps: list[float] = []
    step = next(steps)
    outcomes = list(outcomes)
    try:
        while True:
            if isinstance(step, Sleep):
                sleeps.append(step.seconds)
                time.sleep(step.seconds)
                step = steps.send(None)
                continue
            outcome = outcomes.pop(0)
            step = steps.throw(outcome) if isinstance(outcome, Exception) else steps.send(outcome)
    except StopIteration as done:
        return sleeps, done.value
    except Exception as exc:
        return sleeps, exc


FAST = RetryPolicy(max_retries=2, initial_delay=0.01, max_delay=0.02)


def test_retry_after_is_waited_for_exactly():
    sleeps, result = drive([answer(429, {"Retry-After": "0.2"}), answer(200)], idempotent=True)
    assert sum(sleeps) == pytest.approx(0.2, abs=0.05) and result.status_code == 200


def test_a_completion_is_retried_on_429_and_503_but_not_on_502_or_after_a_read_timeout():
    _, result = drive([answer(503, {"Retry-After": "0"}), answer(200)], idempotent=False, policy=FAST)
    assert result.status_code == 200
    _, error = drive([answer(502), answer(200)], idempotent=False, policy=FAST)
    assert isinstance(error, APIError) and error.status == 502
    _, error = drive([httpx.ReadTimeout("slow", request=REQUEST), answer(200)], idempotent=False, policy=FAST)
    assert isinstance(error, APITimeoutError)
    _, result = drive([httpx.ConnectError("refused", request=REQUEST), answer(200)], idempotent=False, policy=FAST)
    assert result.status_code == 200


def test_an_idempotent_call_is_retried_on_gateway_errors_and_timeouts_up_to_max_retries():
    sleeps, error = drive([answer(502), answer(504), answer(503)], idempotent=True, policy=FAST)
    assert len(sleeps) == 2 and isinstance(error, ServiceUnavailableError)
    _, result = drive([httpx.ReadTimeout("slow", request=REQUEST), answer(200)], idempotent=True, policy=FAST)
    assert result.status_code == 200


def test_500_and_4xx_are_not_retried():
    for status in (500, 400, 404, 409):
        sleeps, error = drive([answer(status)], idempotent=True, policy=FAST)
        assert sleeps == [] and error.status == status


def test_a_retry_after_past_the_cap_is_raised_with_its_value():
    policy = RetryPolicy(max_retries=2, max_retry_after=5)
    sleeps, error = drive([answer(429, {"Retry-After": "30"})], idempotent=True, policy=policy)
    assert sleeps == [] and isinstance(error, RateLimitError) and error.retry_after == 30


def test_backoff_grows_exponentially_within_its_bounds():
    policy = RetryPolicy(initial_delay=0.5, max_delay=8.0)
    for attempt, ceiling in [(0, 0.5), (1, 1.0), (2, 2.0), (5, 8.0), (9, 8.0)]:
        delays = [policy.backoff(attempt) for _ in range(200)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays)


def test_retry_after_reads_seconds_and_http_dates():
    assert parse_retry_after(httpx.Headers({"Retry-After": "7"})) == 7.0
    future = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= parse_retry_after(httpx.Headers({"Retry-After": future})) <= 31
    assert parse_retry_after(httpx.Headers({"Retry-After": "soon"})) is None
    assert parse_retry_after(httpx.Headers({})) is None


def test_stream_events_become_chunks_until_done():
    reader = ChunkReader(200)
    lines = [
        ": keep-alive",
        'data: {"id": "i-1", "choices": [{"index": 0, "text": "ret", "interaction_id": "i-1"}]}',
        "",
        'data: {"id": "i-1", "choices": [{"index": 0, "text": "urn", "finish_reason": "length"}],',
        'data:  "strop": {"version": "v3"}}',
        "",
        "data: [DONE]",
        "",
    ]
    out = [reader.feed(line) for line in lines]
    chunks = [item for item in out if item is not None and item is not DONE]
    assert [c.choices[0].text for c in chunks] == ["ret", "urn"]
    assert chunks[1].strop.version == "v3" and chunks[1].choices[0].finish_reason == "length"
    assert out[-1] is DONE


def test_an_error_event_in_the_stream_raises_a_stream_error():
    reader = ChunkReader(200)
    reader.feed('data: {"error": {"code": "vllm_error", "message": "replica died", "details": {}}}')
    with pytest.raises(StreamError) as caught:
        reader.feed("")
    assert (caught.value.code, caught.value.message, caught.value.status) == ("vllm_error", "replica died", 200)


def test_a_stream_is_split_into_lines_only_where_sse_ends_one_whatever_the_reads():
    """A token may hold U+2028, U+2029 or U+0085 raw inside an event's JSON (the server writes them
    unescaped): the stream splits only at CRLF, LF or CR, also when a read cuts a CRLF or a
    character in two."""
    from strop._streaming import CompletionStream

    texts = ["a\u2028b", "c\u2029d\u0085", "é"]
    events = [
        json.dumps({"id": "i-1", "choices": [{"index": 0, "text": text}]}, ensure_ascii=False) for text in texts
    ]
    ends = ["\n", "\r\n", "\r"]
    body = "".join(f"data: {event}{end}{end}" for event, end in zip(events, ends, strict=True)) + "data: [DONE]"
    raw = body.encode()
    for size in (1, 2, 3, 7, len(raw)):
        reads = [raw[i : i + size] for i in range(0, len(raw), size)]
        stream = CompletionStream(httpx.Response(200, content=iter(reads), request=REQUEST))
        assert [chunk.choices[0].text for chunk in stream] == texts, size
