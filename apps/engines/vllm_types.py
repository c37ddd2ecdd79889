"""What vLLM answers, parsed: completions, stream chunks (and the server-sent events they come in), model cards."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import AsyncIterable, AsyncIterator, Generator, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from apps.engines.stops import tokens_through
from apps.engines.vllm_errors import VLLMError, VLLMUnavailable


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


@dataclass(frozen=True, slots=True)
class CompletionChoice:
    index: int
    text: str
    token_ids: list[int]  # sampled ids; includes EOS and a stop string's token (text does not)
    logprobs: list[float]  # logprob of each sampled token under the model (vLLM raw_logprobs)
    finish_reason: str | None  # "stop" (EOS or stop string), "length"; None mid-stream
    stop_reason: str | int | None  # the stop string or stop token id that matched, if any
    # OpenAI's logprobs detail, one entry per sampled token: its text, where it starts in
    # ``text``, and the top alternatives (the sampled one plus the k a client asked for).
    tokens: list[str] = field(default_factory=list)
    text_offset: list[int] = field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = field(default_factory=list)

    def cut(self, at: int, stop: str) -> CompletionChoice:
        """This choice stopped by ``stop`` starting at character ``at`` of its text: the text
        before it, and the tokens up to the one the stop string starts in (as vLLM keeps them)."""
        kept = tokens_through(self.text_offset, at) if self.text_offset else len(self.token_ids)
        return replace(
            self,
            text=self.text[:at],
            token_ids=self.token_ids[:kept],
            logprobs=self.logprobs[:kept],
            finish_reason="stop",
            stop_reason=stop,
            tokens=self.tokens[:kept],
            text_offset=self.text_offset[:kept],
            top_logprobs=self.top_logprobs[:kept],
        )


@dataclass(frozen=True, slots=True)
class Completion:
    id: str
    model: str
    choices: list[CompletionChoice]
    prompt_token_ids: list[int] | None
    usage: Usage | None
    replica: str

    @property
    def choice(self) -> CompletionChoice:
        return self.choices[0]


@dataclass(frozen=True, slots=True)
class CompletionChunk:
    """One server-sent event of a streamed completion: the new tokens of one or more choices."""

    id: str
    model: str
    choices: list[CompletionChoice]
    prompt_token_ids: list[int] | None  # only on the first chunk of each choice
    usage: Usage | None  # only on the last chunk
    replica: str


@dataclass(frozen=True, slots=True)
class ModelCard:
    id: str
    root: str | None  # the base model's or adapter's path
    parent: str | None  # for an adapter, the base model's served name
    max_model_len: int | None


def merge_chunks(chunks: Iterable[CompletionChunk]) -> Completion:
    """Join a stream's chunks into the completion a non-streamed call would have returned."""
    parts: dict[int, dict[str, Any]] = {}
    first: CompletionChunk | None = None
    prompt_ids: list[int] | None = None
    usage: Usage | None = None
    for chunk in chunks:
        first = first or chunk
        prompt_ids = prompt_ids or chunk.prompt_token_ids
        usage = chunk.usage or usage
        for c in chunk.choices:
            part = parts.setdefault(
                c.index,
                {"text": [], "ids": [], "lps": [], "finish": None, "stop": None, "tok": [], "off": [], "top": []},
            )
            # Offsets restart with each chunk or run on: either way, shift them to the joined text.
            before, first_offset = sum(len(t) for t in part["text"]), c.text_offset[0] if c.text_offset else 0
            part["off"].extend(before + offset - first_offset for offset in c.text_offset)
            part["text"].append(c.text)
            part["ids"].extend(c.token_ids)
            part["lps"].extend(c.logprobs)
            part["tok"].extend(c.tokens)
            part["top"].extend(c.top_logprobs)
            part["finish"] = c.finish_reason or part["finish"]
            part["stop"] = c.stop_reason if c.stop_reason is not None else part["stop"]
    if first is None:
        raise VLLMError("vLLM sent an empty stream")
    choices = [
        CompletionChoice(
            i, "".join(p["text"]), p["ids"], p["lps"], p["finish"], p["stop"], p["tok"], p["off"], p["top"]
        )
        for i, p in sorted(parts.items())
    ]
    return Completion(first.id, first.model, choices, prompt_ids, usage, first.replica)


def parse_usage(raw: Any) -> Usage | None:
    if not isinstance(raw, dict):
        return None
    counts = [int(raw.get(key) or 0) for key in ("prompt_tokens", "completion_tokens", "total_tokens")]
    return Usage(*counts)


def parse_choice(raw: dict[str, Any], replica: str) -> CompletionChoice:
    token_ids = raw.get("token_ids")
    detail = raw.get("logprobs") or {}
    logprobs = detail.get("token_logprobs")
    if token_ids is None or logprobs is None:
        raise VLLMError("vLLM returned no token ids or logprobs (is it older than 0.10.2?)", replica=replica)
    if len(token_ids) != len(logprobs):
        raise VLLMError(f"vLLM returned {len(token_ids)} token ids but {len(logprobs)} logprobs", replica=replica)
    return CompletionChoice(
        index=int(raw.get("index", 0)),
        text=raw.get("text") or "",
        token_ids=[int(t) for t in token_ids],
        logprobs=[float(lp) for lp in logprobs],
        finish_reason=raw.get("finish_reason"),
        stop_reason=raw.get("stop_reason"),
        tokens=[str(t) for t in detail.get("tokens") or []],
        text_offset=[int(o) for o in detail.get("text_offset") or []],
        top_logprobs=list(detail.get("top_logprobs") or []),
    )


def prompt_ids(choices: list[dict[str, Any]]) -> list[int] | None:
    for raw in choices:
        if raw.get("prompt_token_ids") is not None:
            return [int(t) for t in raw["prompt_token_ids"]]
    return None


_DONE: dict[str, Any] = {}
# What is read after vLLM's ``[DONE]`` at most, hoping for the body's end (see ``_drain``).
AFTER_DONE_LINES = 8
AFTER_DONE_S = 1.0


class _SSELineSplitter:
    """A server-sent stream's lines from its bytes as they come: split where the SSE format ends a
    line (LF, CRLF, CR) and nowhere else. httpx's ``iter_lines`` splits as ``str.splitlines`` does,
    also at U+2028, U+2029 and U+0085, which vLLM's JSON carries unescaped when a token holds one,
    and would cut that event in two (and it decodes every byte to text first)."""

    _END = re.compile(rb"\r\n|\r|\n")

    def __init__(self) -> None:
        self._pending: list[bytes] = []  # the unfinished line's pieces: each read is scanned once
        self._after_cr = False

    def feed(self, chunk: bytes) -> list[bytes]:
        if self._after_cr and chunk.startswith(b"\n"):  # a CRLF cut between two reads
            chunk = chunk[1:]
        if not chunk:
            return []
        self._after_cr = chunk.endswith(b"\r")
        *lines, rest = self._END.split(chunk)
        if not lines:
            self._pending.append(chunk)
            return []
        if self._pending:
            lines[0] = b"".join([*self._pending, lines[0]])
        self._pending = [rest] if rest else []
        return lines

    def end(self) -> list[bytes]:
        """The last line, if the stream ended without ending it."""
        rest, self._pending = b"".join(self._pending), []
        return [rest] if rest else []


def sse_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    splitter = _SSELineSplitter()
    for chunk in chunks:
        yield from splitter.feed(chunk)
    yield from splitter.end()


async def asse_lines(chunks: AsyncIterable[bytes]) -> AsyncIterator[bytes]:
    splitter = _SSELineSplitter()
    async for chunk in chunks:
        for line in splitter.feed(chunk):
            yield line
    for line in splitter.end():
        yield line


def _sse_event(line: bytes, replica: str) -> dict[str, Any] | None:
    """One line of a server-sent stream: its JSON (``_DONE`` at the end), None for any other line;
    vLLM's error event after the 200 raises."""
    if not line.startswith(b"data:"):
        return None
    payload = line[5:].strip()
    if payload == b"[DONE]":
        return _DONE
    data = json.loads(payload.decode("utf-8", "replace"))  # not orjson: vLLM may send -Infinity
    if "error" in data:  # vLLM reports a failure after the 200 as one more event
        message = data["error"].get("message", str(data["error"]))
        raise VLLMError(f"vLLM failed mid-stream: {message}", replica=replica)
    return data  # type: ignore[no-any-return]


def _drain(lines: Iterator[bytes]) -> None:
    """Read what follows ``[DONE]``: vLLM's body ends right there, and a body read to its end keeps
    its connection for the next request (one closed before it is discarded, so every streamed
    completion would open a new connection). Anything more, or a failure reading it, costs only
    the connection."""
    try:
        for _ in itertools.islice(lines, AFTER_DONE_LINES):
            pass
    except (httpx.TimeoutException, httpx.TransportError):
        pass


async def _adrain(lines: AsyncIterator[bytes]) -> None:
    """:func:`_drain`, within ``AFTER_DONE_S``: the client's own ``[DONE]`` waits for it."""
    try:
        async with asyncio.timeout(AFTER_DONE_S):
            for _ in range(AFTER_DONE_LINES):
                if await anext(lines, None) is None:
                    return
    except (TimeoutError, httpx.TimeoutException, httpx.TransportError):
        pass


def read_sse_json(response: httpx.Response, replica: str) -> Generator[dict[str, Any], None, None]:
    """A streamed answer's server-sent events, one JSON object each, until ``[DONE]``; vLLM's error
    event after the 200, a stall or a dropped connection raise. Closes the response at the end."""
    try:
        lines = sse_lines(response.iter_bytes())
        for line in lines:
            data = _sse_event(line, replica)
            if data is _DONE:
                _drain(lines)
                return
            if data is not None:
                yield data
    except httpx.TimeoutException as exc:
        raise VLLMUnavailable(f"vLLM at {replica} stalled mid-stream", replica=replica) from exc
    except httpx.TransportError as exc:
        raise VLLMUnavailable(f"vLLM at {replica} dropped the stream: {exc}", replica=replica) from exc
    finally:
        response.close()


async def aread_sse_json(response: httpx.Response, replica: str) -> AsyncIterator[dict[str, Any]]:
    """:func:`read_sse_json` on an asynchronous response."""
    try:
        lines = asse_lines(response.aiter_bytes())
        async for line in lines:
            data = _sse_event(line, replica)
            if data is _DONE:
                await _adrain(lines)
                return
            if data is not None:
                yield data
    except httpx.TimeoutException as exc:
        raise VLLMUnavailable(f"vLLM at {replica} stalled mid-stream", replica=replica) from exc
    except httpx.TransportError as exc:
        raise VLLMUnavailable(f"vLLM at {replica} dropped the stream: {exc}", replica=replica) from exc
    finally:
        await response.aclose()
