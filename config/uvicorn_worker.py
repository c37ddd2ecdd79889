"""The API's gunicorn worker: uvicorn's, with a graceful shutdown that ends before gunicorn's.

On SIGTERM gunicorn gives a worker ``graceful_timeout`` seconds, then kills it outright, and a
stream killed so records nothing. uvicorn's worker waits for its open requests with no limit of its
own, so a stream longer than that grace was killed mid-way. Here uvicorn waits at most
``graceful_timeout - RECORD_MARGIN_S`` (at least half the grace), then cancels what is still open:
each stream's end closes its upstream and records what it served, in the margin left before the
kill (platform/gunicorn.conf.py, docs/operate.md)."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Mapping
from typing import Any

from gunicorn.arbiter import Arbiter
from uvicorn.server import Server
from uvicorn_worker import UvicornWorker

RECORD_MARGIN_S = 5.0
LOOPS = ("auto", "uvloop", "asyncio")
PARSERS = ("auto", "httptools", "h11")


def stream_grace_s(graceful_timeout: float) -> float:
    """How long uvicorn lets open streams run after SIGTERM before it cancels them."""
    return max(graceful_timeout / 2, graceful_timeout - RECORD_MARGIN_S)


class _Server(Server):
    record_s = 0.0

    async def shutdown(self, sockets: Any = None) -> None:
        """uvicorn's shutdown, then a wait for the streams it cancelled to record what they served
        (uvicorn cancels them and returns at once; the worker would exit before they ran)."""
        await super().shutdown(sockets)
        cancelled = [task for task in self.server_state.tasks if not task.done()]
        if cancelled:
            await asyncio.wait(cancelled, timeout=self.record_s)


def server_choices(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """uvicorn's event loop and HTTP parser: ``auto`` takes uvloop and httptools, which Strop installs
    (against the pure-Python asyncio loop and h11 parser: 7-28 % less API CPU a streamed completion
    in the mock sweep, docs/performance.md);
    ``STROP_API_LOOP=asyncio`` or ``STROP_API_HTTP=h11`` names the pure-Python one (docs/operate.md)."""
    choices = {}
    for key, setting, allowed in (("loop", "STROP_API_LOOP", LOOPS), ("http", "STROP_API_HTTP", PARSERS)):
        value = environ.get(setting) or "auto"
        if value not in allowed:  # uvicorn would take it as a module path and fail at boot, obscurely
            raise ValueError(f"{setting} is {value!r}: it must be one of {', '.join(allowed)}")
        choices[key] = value
    return choices


class StropUvicornWorker(UvicornWorker):
    CONFIG_KWARGS = server_choices()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        graceful = float(self.cfg.graceful_timeout)
        self.config.timeout_graceful_shutdown = stream_grace_s(graceful)
        self.record_s = max(0.5, graceful - stream_grace_s(graceful) - 1.0)

    async def _serve(self) -> None:  # uvicorn_worker's, with the server above
        self.config.app = self.wsgi
        server = _Server(config=self.config)
        server.record_s = self.record_s
        self._install_sigquit_handler()
        await server.serve(sockets=self.sockets)
        if not server.started:
            sys.exit(Arbiter.WORKER_BOOT_ERROR)
