"""The serving path's database work, off the event loop, on a few threads that keep their
connections.

An asynchronous view must not touch the ORM from the event loop. Each call here runs on one of
``STROP_SERVING_DB_THREADS`` threads per API process: Django's connections are per thread, so each
keeps its Postgres connection across requests (``CONN_MAX_AGE``) as a gthread worker's threads do,
instead of connecting anew for every completion. Like Django's own request signals, a call first
closes a connection that broke or outlived ``CONN_MAX_AGE``, so a restarted Postgres costs one
failed request at most per thread. The request's id and tenant follow the call into the thread
(the log lines it writes carry them) and the tenant it binds comes back (the access log's).

The pool is the ASGI server's (``config/asgi.py`` turns it on). Anywhere else (Django's test
client, a WSGI server, a script) the call runs as Django runs any synchronous code called from
asynchronous code: on the thread that serves the request, with its connection (a test's
transaction included).
"""

from __future__ import annotations

import asyncio
import functools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import close_old_connections

from apps.common.observability import context

T = TypeVar("T")

_executor: ThreadPoolExecutor | None = None
_executor_pid: int | None = None
_pooled = False


def pooled() -> bool:
    """Whether this process serves under the ASGI server (``config/asgi.py``)."""
    return _pooled


def pool_use() -> None:
    """Serve the database work of asynchronous views on this process's pool (the ASGI server)."""
    global _pooled
    _pooled = True


def _pool() -> ThreadPoolExecutor:
    """The process's threads (made again after a fork: gunicorn's workers)."""
    global _executor, _executor_pid
    if _executor is None or _executor_pid != os.getpid():
        _executor = ThreadPoolExecutor(max_workers=settings.STROP_SERVING_DB_THREADS, thread_name_prefix="serving-db")
        _executor_pid = os.getpid()
    return _executor


def _run(fn: Callable[..., T], request_id: str | None, tenant: str | None, args: Any, kwargs: Any) -> tuple[T, Any]:
    bound = context.bind(request_id=request_id, tenant=tenant)
    close_old_connections()
    try:
        return fn(*args, **kwargs), context.current_tenant()
    finally:
        context.unbind(bound)


async def in_db_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` on a serving database thread. Once submitted it runs to its end even
    if the awaiting request is cancelled (a client that left): a record is never cut in half."""
    if not _pooled:
        return await sync_to_async(fn, thread_sensitive=True)(*args, **kwargs)
    loop = asyncio.get_running_loop()
    call = functools.partial(_run, fn, context.current_request_id(), context.current_tenant(), args, kwargs)
    result, tenant = await loop.run_in_executor(_pool(), call)
    if tenant and tenant != context.current_tenant():
        context.bind_tenant(tenant)
    return result
