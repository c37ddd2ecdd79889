"""The serving endpoints as asynchronous views: the synchronous half under DRF, the wait on vLLM
on the event loop.

A serving API (``ServingApi``) keeps its DRF class: authentication, the rate limit, validation,
routing, the A/B assignment and the tenant's stream cap run in its ``post``, on a serving database
thread (:mod:`apps.serving.sync_work`), and answer errors exactly as every other endpoint does.
When the request is good, ``post`` answers a :class:`Planned` response instead of a completion,
and :func:`serving_view` serves it here: the call to vLLM, the stream and its record are awaited,
so a stream holds a connection and a coroutine while it waits for tokens, never a thread.

Every answer carries ``X-Strop-Overhead-Ms``: the time Strop spent on the request apart from
waiting on vLLM (for a stream, up to its first byte); a completion's is also in /metrics as
``strop_serving_overhead_seconds``, a refusal's or an error's only in the header. Each process
serves at most ``STROP_SERVING_MAX_IN_FLIGHT`` completions at once (:mod:`apps.serving.admission`).

Under anything but the ASGI server (Django's test client, a WSGI server) each request gets an event
loop of its own that ends with the view, and Django would read an asynchronous stream whole
anyway, on another loop: there the stream is read whole before the view returns, and the loop's
connections to vLLM are closed with it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from django.http import HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.template.response import SimpleTemplateResponse
from prometheus_client import Histogram

from apps.common.apis import server_error
from apps.common.exception_handler import DATABASE_RETRY_AFTER_S, database_unreachable
from apps.common.exceptions import ApplicationError, RateLimited, ServiceUnavailable
from apps.engines.vllm_transport import async_http_close
from apps.serving import admission
from apps.serving.sync_work import in_db_thread, pooled

logger = logging.getLogger("django.request")

SERVING_OVERHEAD = Histogram(
    "strop_serving_overhead_seconds",
    "Time Strop added to a completion (everything but the wait on vLLM; a stream: up to its first byte), "
    "by endpoint and whether it was streamed",
    ["endpoint", "streamed"],
    buckets=(0.0005, 0.001, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
    registry=None,
)


class Planned(HttpResponse):
    """A serving API's synchronous half, done: ``plan`` (a ``CompletionPlan`` / ``ChatPlan``), the
    shaper of its answer, how to serve it whole or streamed, and the tenant's stream lease.

    What the call holds (the upstream stream, the process's slot, the tenant's lease) is given back
    by :meth:`release`, once, whoever calls it first: the stream's end, the view, or the ASGI
    handler when the client left before the stream started (a generator that never started never
    runs its ``finally``)."""

    def __init__(
        self,
        plan: Any,
        *,
        shape: Callable[[Any], dict[str, Any]],
        serve: Callable[[Any], Awaitable[Any]],
        stream: Callable[[Any], Awaitable[AsyncIterator[Any]]],
        lease: admission.StreamLease | None = None,
    ) -> None:
        super().__init__(status=200)
        self.plan, self.shape, self.serve, self.stream, self.lease = plan, shape, serve, stream, lease
        self.upstream: AsyncIterator[Any] | None = None
        self.holds_slot = False
        self._releasing: asyncio.Future[None] | None = None

    async def release(self) -> None:
        """Close the upstream stream (what was served is recorded), return the process's slot and
        the tenant's lease. Idempotent; runs to its end even if the caller is cancelled."""
        if self._releasing is None:
            self._releasing = asyncio.ensure_future(self._release())
        await asyncio.shield(self._releasing)

    async def _release(self) -> None:
        upstream, self.upstream = self.upstream, None
        try:
            if upstream is not None:
                await upstream.aclose()  # type: ignore[attr-defined]
        finally:
            await _released(self.holds_slot, self.lease)
            self.holds_slot, self.lease = False, None


async def response_release(response: Any) -> None:
    """Give back what a serving answer holds (:meth:`Planned.release`); nothing for any other."""
    planned = getattr(response, "strop_planned", None)
    if planned is not None:
        await planned.release()


def error_response(exc: ApplicationError) -> HttpResponse:
    """The answer DRF's exception handler gives the same error (``apps.common.exception_handler``)."""
    response = HttpResponse(
        orjson.dumps({"error": exc.as_dict()}), status=exc.status_code, content_type="application/json"
    )
    if isinstance(exc, (RateLimited, ServiceUnavailable)):
        if exc.retry_after_s is None:
            response["x-should-retry"] = "false"
        else:
            response["Retry-After"] = str(exc.retry_after_s)
    return response


def _dispatch(view: Callable[..., HttpResponseBase], request: HttpRequest, args: Any, kwargs: Any) -> HttpResponseBase:
    response = view(request, *args, **kwargs)
    if isinstance(response, SimpleTemplateResponse) and not response.is_rendered:
        response.render()  # a DRF answer (an error, or any answer but a Planned one), rendered here
    return response


def _observe(response: HttpResponseBase, endpoint: str, streamed: bool, seconds: float) -> None:
    response["X-Strop-Overhead-Ms"] = f"{seconds * 1000:.2f}"
    SERVING_OVERHEAD.labels(endpoint, "true" if streamed else "false").observe(seconds)


async def _released(slot: bool, lease: admission.StreamLease | None) -> None:
    if slot:
        admission.process_slot_return()
    if lease is not None:
        await asyncio.shield(asyncio.ensure_future(in_db_thread(admission.stream_lease_return, lease)))


def serving_view(drf_view: Callable[..., HttpResponseBase], endpoint: str) -> Callable[..., Awaitable[Any]]:
    """The asynchronous view of a serving API (``drf_view``: its DRF view function)."""
    from apps.serving.answers import sse_response

    async def view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        started = time.perf_counter()
        upstream: list[Any] = []  # the plan, once there is one: its wait on vLLM is not Strop's
        try:
            response = await answer(request, started, upstream, args, kwargs)
        except Exception:  # a bug: the 500 Django would answer, logged as Django logs it, with the header
            logger.exception("Internal Server Error: %s", request.path)
            response = server_error(request)
        if "X-Strop-Overhead-Ms" not in response:  # a refusal or an error says it too
            waited = upstream[0].upstream_s if upstream else 0.0
            response["X-Strop-Overhead-Ms"] = f"{(time.perf_counter() - started - waited) * 1000:.2f}"
        return response

    async def answer(
        request: HttpRequest, started: float, upstream: list[Any], args: Any, kwargs: Any
    ) -> HttpResponseBase:
        try:
            admission.process_slot_take()
        except admission.ServerBusy as exc:
            return error_response(exc)
        planned: Planned | None = None
        holds_slot, handed_over = True, False
        try:
            dispatched = asyncio.ensure_future(in_db_thread(_dispatch, drf_view, request, args, kwargs))
            try:
                response = await asyncio.shield(dispatched)
            except asyncio.CancelledError:  # the sync half still runs (and may take a lease): wait, release
                done = await asyncio.shield(dispatched)
                if isinstance(done, Planned):
                    done.holds_slot, holds_slot = True, False
                    await done.release()
                raise
            if not isinstance(response, Planned):
                return response
            planned, plan = response, response.plan
            upstream.append(plan)
            planned.holds_slot, holds_slot = True, False
            if plan.stream:
                planned.upstream = await planned.stream(plan)
                response = sse_response(_bodies(planned))
                response.strop_planned = planned  # type: ignore[attr-defined]  # released if never sent
                if not pooled():  # not the ASGI server: read whole on this event loop (see below)
                    parts: Any = response.streaming_content  # sse_response's body: asynchronous
                    response.streaming_content = [part async for part in parts]
            else:
                answer = await planned.serve(plan)
                response = HttpResponse(orjson.dumps(planned.shape(answer)), content_type="application/json")
            _observe(response, endpoint, plan.stream, time.perf_counter() - started - plan.upstream_s)
            handed_over = plan.stream and pooled()  # then the stream's end (or the ASGI handler) releases it
            return response
        except ApplicationError as exc:
            return error_response(exc)
        except Exception as exc:
            if not database_unreachable(exc):
                raise
            message = "the database is unreachable; try again shortly"
            return error_response(ServiceUnavailable(message, retry_after_s=DATABASE_RETRY_AFTER_S))
        finally:
            if holds_slot:
                admission.process_slot_return()
            if planned is not None and not handed_over:
                await planned.release()
            if not pooled():
                await async_http_close()

    async def _bodies(planned: Planned) -> AsyncIterator[dict[str, Any]]:
        try:
            assert planned.upstream is not None
            async for chunk in planned.upstream:
                yield planned.shape(chunk)
        finally:
            await planned.release()  # closes upstream: records what was served

    view.csrf_exempt = True  # type: ignore[attr-defined]  # as DRF's views: a key, never a cookie
    # What drf-spectacular reads to publish the endpoint's schema: the DRF class, unchanged.
    view.cls = drf_view.cls  # type: ignore[attr-defined]
    view.initkwargs = drf_view.initkwargs  # type: ignore[attr-defined]
    return view
