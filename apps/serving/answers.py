"""Shaping vLLM's answer as OpenAI's completion objects (Strop's fields added), and streaming bodies as
server-sent events; the chat endpoint streams through ``sse_response`` too."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import orjson
from django.http import StreamingHttpResponse

from apps.common.apis import server_error_body
from apps.common.exception_handler import database_unreachable
from apps.common.exceptions import ApplicationError, ServiceUnavailable
from apps.engines.vllm_client import Completion, CompletionChoice, CompletionChunk
from apps.serving.completion_requests import CompletionRequest, suffix_shown
from apps.serving.services import Route

logger = logging.getLogger(__name__)

EVENT_STREAM = "text/event-stream"  # a stream's media type (apps.serving.apis.ServingNegotiation accepts it)


def logprobs_body(choice: CompletionChoice) -> dict[str, Any]:
    return {
        "tokens": choice.tokens,
        "token_logprobs": choice.logprobs,
        "top_logprobs": choice.top_logprobs,
        "text_offset": choice.text_offset,
    }


class CompletionAnswer:
    """Shapes vLLM's answer (or stream chunks) as OpenAI's completion objects, Strop's fields added."""

    def __init__(self, request: CompletionRequest, route: Route, ids: list[str], model: str) -> None:
        self.request, self.route, self.ids, self.model = request, route, ids, model
        self.created = int(time.time())
        self.echoed: set[int] = set()
        self.strop: dict[str, Any] = {"version": route.vllm_model, "max_tokens": request.max_tokens}
        if request.max_tokens_requested is not None:
            self.strop["max_tokens_requested"] = request.max_tokens_requested
        if request.is_fim:
            self.strop["fim"] = {
                "convention": request.fim_convention or "prefix/suffix",
                "suffix_shown_to_model": suffix_shown(route.adapter.base_model, request),
            }

    def choice(self, choice: CompletionChoice) -> dict[str, Any]:
        text = choice.text
        if self.request.echo and choice.index not in self.echoed:
            self.echoed.add(choice.index)
            text = (self.request.prompt or self.request.prefix) + text
        return {
            "index": choice.index,
            "text": text,
            "logprobs": logprobs_body(choice) if self.request.logprobs is not None else None,
            "finish_reason": choice.finish_reason,
            "interaction_id": self.ids[choice.index],
        }

    def body(self, completion: Completion | CompletionChunk) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.ids[0],
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [self.choice(c) for c in completion.choices],
            "strop": self.strop,
        }
        if completion.usage is not None:
            usage = completion.usage
            body["usage"] = {
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "total_tokens": usage.total_tokens,
            }
        return body


def sse_response(bodies: AsyncIterator[dict[str, Any]]) -> StreamingHttpResponse:
    """Server-sent events, one ``data: <JSON>`` per body; if vLLM fails mid-stream (the bodies
    raise), ``data: {"error": …}``, which the openai client raises as APIError; then ``[DONE]``.
    Any other failure (the stream's record when the database is unreachable, a bug) ends the same
    way, in OpenAI's shape, and is logged: the client never sees a stream cut without an end.
    Asynchronous: under the ASGI server the stream holds no thread while it waits."""

    async def events() -> AsyncIterator[bytes]:
        error: dict[str, Any] | None = None
        try:
            async for body in bodies:
                yield b"data: " + orjson.dumps(body) + b"\n\n"
        except ApplicationError as exc:
            error = {"error": exc.as_dict()}
        except Exception as exc:
            error = _stream_failure(exc)
        except BaseException:  # the client left: upstream closed, what was served recorded
            await _closed(bodies)
            raise
        error = await _closed(bodies) or error
        if error is not None:
            yield b"data: " + orjson.dumps(error) + b"\n\n"
        yield b"data: [DONE]\n\n"

    response = StreamingHttpResponse(events(), content_type=EVENT_STREAM)
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


async def _closed(bodies: AsyncIterator[dict[str, Any]]) -> dict[str, Any] | None:
    """Close ``bodies`` (the upstream with it; what was served is recorded then): the error event
    if that failed, else None."""
    try:
        await bodies.aclose()  # type: ignore[attr-defined]
    except ApplicationError as exc:
        return {"error": exc.as_dict()}
    except Exception as exc:
        return _stream_failure(exc)
    return None


def _stream_failure(exc: Exception) -> dict[str, Any]:
    """The error event of a stream that failed on Strop's side (not vLLM's), logged here."""
    if database_unreachable(exc):
        logger.warning("a stream failed: the database is unreachable (%s)", type(exc).__name__)
        unreachable = ServiceUnavailable("the database is unreachable; try again shortly")
        return {"error": unreachable.as_dict()}
    logger.exception("a stream failed on the server's side")
    return server_error_body()
