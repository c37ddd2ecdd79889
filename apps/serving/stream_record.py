"""A stream's interactions, written as they are served, so that a worker killed outright (SIGKILL,
the OOM killer, a crash) loses only what it served since the last write.

Each API process writes what its open streams have served so far every
``STROP_SERVING_RECORD_EVERY_S``, every stream that sent a chunk since in one statement
(``interactions_upsert``: the first write of a stream inserts its rows, later ones bring the served
text, tokens, latency and metadata up to date). The stream's own last write, at its end or when the
client leaves, completes them. So there is still exactly one interaction per choice, feedback for
its id finds it while the stream runs, a write that fails (Postgres restarting) is made good by the
next one, and the cost is one statement per interval per process, however many streams are open;
a stream shorter than the interval costs nothing more than its last write.

The last write of a stream waits for the batch on its way that holds it: the database threads would
otherwise be free to run the older write after the newer one.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

from django.conf import settings

from apps.interactions.rows import interactions_upsert
from apps.serving.sync_work import in_db_thread, pooled

logger = logging.getLogger(__name__)

# Rows per statement (26 parameters each): under Postgres's 65,535 parameters.
BATCH_ROWS = 1000

Rows = Callable[[], list[tuple]]


class StreamRecord:
    """When a stream's record is written. ``so_far()`` takes a snapshot of what was served (on the
    event loop) and returns what builds its rows (on a database thread); ``last()`` starts the
    stream's last write, with the same snapshot taken at once."""

    def __init__(self, so_far: Callable[[], Rows], last: Callable[[], Awaitable[Any]]) -> None:
        self.so_far, self._last = so_far, last
        self.dirty = False  # served more since the last batch took it
        self.pending: asyncio.Future[Any] | None = None  # the batch on its way that holds it

    def served(self) -> None:
        """A chunk went to the client: the next batch writes it. Only under the ASGI server: anywhere
        else a stream is read whole before anything is sent (``apps.serving.async_views``)."""
        if not self.dirty and pooled():
            self.dirty = True
            _flusher().add(self)

    def then(self, last: Callable[[], Awaitable[Any]]) -> asyncio.Future[Any]:
        """Leave the batches and run ``last`` once the batch on its way (if any) is done; submitted
        now, so it runs to its end even if the awaiting task is cancelled (a client that left):
        await it shielded."""
        _flusher().remove(self)
        pending, self.pending = self.pending, None

        async def after() -> Any:
            if pending is not None:
                try:
                    await pending
                except Exception:
                    pass  # logged by the flusher; the last write makes it good
            return await last()

        return asyncio.ensure_future(after())

    def final(self) -> asyncio.Future[Any]:
        """The last write: what was served, whole (see :meth:`then`)."""
        write = self._last()  # its snapshot taken now, before anything else is served or awaited
        return self.then(lambda: write)


class _Flusher:
    """The event loop's open streams with something new to write, written every interval."""

    def __init__(self) -> None:
        self.records: dict[StreamRecord, None] = {}
        self.task: asyncio.Task[None] | None = None

    def add(self, record: StreamRecord) -> None:
        self.records[record] = None
        if self.task is None or self.task.done():
            # A context of its own: not the request's that happened to start it (its id, its tenant).
            self.task = asyncio.get_running_loop().create_task(self._run(), context=contextvars.Context())

    def remove(self, record: StreamRecord) -> None:
        self.records.pop(record, None)

    async def _run(self) -> None:
        while self.records:
            await asyncio.sleep(settings.STROP_SERVING_RECORD_EVERY_S)
            due = [record for record in self.records if record.dirty]
            if not due:
                continue
            builders = []
            for record in due:
                record.dirty = False
                builders.append(record.so_far())
            batch = asyncio.ensure_future(in_db_thread(_write, builders))
            for record in due:
                record.pending = batch
            try:
                await asyncio.shield(batch)
            except Exception as exc:
                logger.warning("open streams' records not brought up to date (their next write does it): %s", exc)


def _write(builders: list[Rows]) -> None:
    rows = [row for build in builders for row in build()]
    for start in range(0, len(rows), BATCH_ROWS):
        interactions_upsert(rows[start : start + BATCH_ROWS])


_flushers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Flusher] = weakref.WeakKeyDictionary()


def _flusher() -> _Flusher:
    loop = asyncio.get_running_loop()
    flusher = _flushers.get(loop)
    if flusher is None:
        flusher = _flushers[loop] = _Flusher()
    return flusher
