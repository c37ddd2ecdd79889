"""Strop's one application for the ASGI server (gunicorn with uvicorn workers: platform/Procfile).

The serving endpoints (``/v1/completions``, ``/v1/chat/completions``) are asynchronous views: a
stream waits for tokens on the event loop, holding no thread, and their database work runs on a
few threads that keep their connections (``apps.serving.sync_work``). Everything else (the rest
of the API, the dashboard, the admin) is synchronous Django as before; each of those requests runs
on one of ``STROP_API_SYNC_THREADS`` threads of the process (its "lanes"), whose database
connections live ``CONN_MAX_AGE`` as a gthread worker's do, instead of a new thread (and a new
Postgres connection) per request. A request waits for a free lane; the serving endpoints never
take one. docs/operate.md describes the process model.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402  (the settings module first)
from django.conf import settings  # noqa: E402
from django.core.handlers.asgi import ASGIHandler  # noqa: E402
from django.core.handlers.base import BaseHandler  # noqa: E402
from django.http import HttpRequest  # noqa: E402
from django.http.response import HttpResponseBase  # noqa: E402

SERVING_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})

# Threads kept for the completions' middleware chains once they are done (one per completion in the
# chain at once: a whole completion holds its own until its answer is ready, a stream until it starts).
IDLE_CHAIN_THREADS = 256


def _chain_thread() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="serving-chain")


# The tasks Django starts for one serving request (its answer's): cancelled with the request.
_request_tasks: contextvars.ContextVar[list[asyncio.Task[Any]]] = contextvars.ContextVar("strop_request_tasks")


class StropASGIHandler(ASGIHandler):
    """Django's ASGI handler, but a synchronous request runs on one of the process's lanes, and a
    completion passes the middleware in one synchronous chain.

    Django runs the middleware of an asynchronous view asynchronously, and each of ours that is
    synchronous at heart then costs a hop to a thread and back, twice (process_request and
    process_response): some sixteen hops a completion. The completions' chain is the same
    middleware, in the same order, built synchronous: one hop into a thread, one back to the loop
    for the view, whose wait on vLLM and stream stay on the loop."""

    def __init__(self) -> None:
        super().__init__()
        self._lanes: asyncio.Queue[ThreadPoolExecutor] | None = None
        self._idle_chains: list[ThreadPoolExecutor] = []  # touched on the event loop only
        self._serving_chain = BaseHandler()
        self._serving_chain.load_middleware(is_async=False)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        if request.path not in SERVING_PATHS:
            return await super().get_response_async(request)
        tasks, task = _request_tasks.get(None), asyncio.current_task()
        if tasks is not None and task is not None:
            tasks.append(task)
        chain = asyncio.ensure_future(sync_to_async(self._serving_chain.get_response, thread_sensitive=True)(request))
        try:
            return await asyncio.shield(chain)
        except asyncio.CancelledError:
            from apps.serving.async_views import response_release

            # The client left while the chain ran: Django drops its answer unsent and unclosed, so
            # the stream it holds (upstream, the process's slot, the tenant's lease) is given back here.
            await response_release(await asyncio.shield(chain))
            raise

    async def send_response(self, response: HttpResponseBase, send: Any) -> None:
        try:
            await super().send_response(response, send)
        finally:  # a stream cut before its body started never runs its own release
            from apps.serving.async_views import response_release

            await response_release(response)

    async def _serving_call(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        """Django's handling of a completion, whose own tasks are cancelled with it: Django runs the
        answer in a task of its own that a cancelled request (the server's graceful shutdown ran
        out) leaves running, and the worker exits under it, its stream unrecorded. Cancelled here,
        the stream ends, closes its upstream and records what it served."""
        tasks: list[asyncio.Task[Any]] = []
        token = _request_tasks.set(tasks)
        # Django's own __call__ makes a thread for each request's chain and another to join it
        # after: two thread starts a completion. The chain's thread is taken from the idle ones here.
        chain = self._idle_chains.pop() if self._idle_chains else _chain_thread()
        reuse = True
        try:
            async with ThreadSensitiveContext(executor=chain):
                await self.handle(scope, receive, send)
        except asyncio.CancelledError:
            reuse = False  # a chain call may still run on its thread: the next request must not queue behind it
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        finally:
            _request_tasks.reset(token)
            if reuse and len(self._idle_chains) < IDLE_CHAIN_THREADS:
                self._idle_chains.append(chain)
            else:
                chain.shutdown(wait=False)

    def _lane_queue(self) -> asyncio.Queue[ThreadPoolExecutor]:
        if self._lanes is None:  # made on the worker's event loop, after the fork
            self._lanes = asyncio.Queue()
            for n in range(settings.STROP_API_SYNC_THREADS):
                self._lanes.put_nowait(ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"lane-{n}"))
        return self._lanes

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope.get("path") in SERVING_PATHS:
            await self._serving_call(scope, receive, send)
            return
        if scope["type"] != "http":
            await super().__call__(scope, receive, send)
            return
        lanes = self._lane_queue()
        lane = await lanes.get()
        try:
            async with ThreadSensitiveContext(executor=lane):
                await self.handle(scope, receive, send)
        finally:
            lanes.put_nowait(lane)


def _application() -> StropASGIHandler:
    django.setup(set_prefix=False)
    from django.urls import get_resolver

    from apps.serving.sync_work import pool_use

    pool_use()
    _ = get_resolver().url_patterns  # import every view now, not on the event loop at the first request
    return StropASGIHandler()


application = _application()
