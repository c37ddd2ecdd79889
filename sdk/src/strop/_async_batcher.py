"""The feedback batcher of the asyncio client: one task on the running loop sends what callers
enqueue. Same policy and bookkeeping as the thread batcher (``_batch_core``)."""

from __future__ import annotations

import asyncio
import atexit
import time
from collections.abc import Mapping
from typing import Any

import httpx

from strop._async_drivers import run_async
from strop._batch_core import (
    BatcherOptions,
    BatcherStats,
    FailedBatch,
    FeedbackQueue,
    RejectedEvent,
    Settlement,
    delivery,
    report,
)
from strop._batcher import clamp_timeout, deliver_sync
from strop._core import ClientConfig, encode_json
from strop._exceptions import StropError

__all__ = ["AsyncFeedbackBatcher"]


class AsyncFeedbackBatcher:
    """Collects feedback events and sends them in batches from a task on the running loop.

    :meth:`enqueue` is a plain method that never blocks or awaits (call it from the loop's
    thread). ``await flush()`` and ``await close()`` as in the thread batcher. At interpreter
    exit, events still queued (the loop ended without ``close()``) are sent synchronously,
    within ``close_timeout``.
    """

    def __init__(self, *, http: httpx.AsyncClient, config: ClientConfig, options: BatcherOptions | None = None) -> None:
        self.options = options or BatcherOptions()
        self._http = http
        self._config = config
        self._queue = FeedbackQueue(self.options)
        self._task: asyncio.Task[None] | None = None
        self._wake: asyncio.Event | None = None
        self._settled: asyncio.Event | None = None
        self._closing: asyncio.Event | None = None
        self._deadline: float | None = None
        self._flush_upto = 0
        self._closed = False
        self._exit_hook_registered = False

    # ---- callers ----

    def enqueue(self, item: Mapping[str, Any]) -> None:
        """Queue one feedback event. Raises ``TypeError`` / ``ValueError`` at once for a value
        JSON cannot carry, ``RuntimeError`` after :meth:`close` or outside a running loop."""
        encoded = encode_json(dict(item))
        if self._closed:
            raise RuntimeError("the feedback batcher is closed")
        loop = asyncio.get_running_loop()
        self._queue.push(encoded, time.monotonic())
        self._ensure_task(loop)
        if self._queue.wants_wake():
            assert self._wake is not None
            self._wake.set()

    async def flush(self, timeout: float | None = None) -> bool:
        """Send what is queued now and wait until every event enqueued before this call has ended.
        True when they were all delivered or rejected by the API; False when ``timeout`` ran out
        first or some failed or were dropped."""
        target, lost = self._queue.next_seq, self._queue.lost()
        if self._queue.settled_through(target):
            return True
        self._flush_upto = max(self._flush_upto, target)
        self._ensure_task(asyncio.get_running_loop())
        assert self._wake is not None and self._settled is not None
        self._wake.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._queue.settled_through(target):
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            self._settled.clear()
            try:
                await asyncio.wait_for(self._settled.wait(), remaining)
            except asyncio.TimeoutError:
                pass
        return self._queue.lost() == lost

    async def close(self, timeout: float | None = None) -> bool:
        """Stop accepting events, keep delivering for up to ``timeout`` seconds (default
        ``close_timeout``), then fail what is left (``stats.failed``, ``failures``). True when
        everything held at close was delivered or rejected by the API."""
        timeout = self.options.close_timeout if timeout is None else timeout
        lost = self._queue.lost()
        if not self._closed:
            self._closed = True
            self._deadline = time.monotonic() + timeout
            if self._closing is not None and self._wake is not None:
                self._closing.set()
                self._wake.set()
        if self._exit_hook_registered:
            atexit.unregister(self._at_exit)
            self._exit_hook_registered = False
        task = self._task
        if task is not None and not task.done():
            remaining = max(0.0, (self._deadline or 0.0) - time.monotonic()) + 1.0
            try:
                await asyncio.wait_for(asyncio.shield(task), remaining)
            except asyncio.TimeoutError:
                task.cancel()  # a try stuck past the deadline: its batch goes back to the queue
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        failed = self._queue.abandon_pending("not delivered before the batcher's close timeout")
        report(self.options, [], [failed] if failed else [])
        return self._queue.settled_through(self._queue.next_seq) and self._queue.lost() == lost

    @property
    def stats(self) -> BatcherStats:
        return self._queue.stats()

    @property
    def rejected(self) -> list[RejectedEvent]:
        return list(self._queue.rejected_events)

    @property
    def failures(self) -> list[FailedBatch]:
        return list(self._queue.failures)

    # ---- the sender task ----

    def _ensure_task(self, loop: asyncio.AbstractEventLoop) -> None:
        """Start the sender on this loop (again, if an earlier loop ended and took it with it)."""
        if self._task is not None and not self._task.done() and self._task.get_loop() is loop:
            return
        self._wake, self._settled, self._closing = asyncio.Event(), asyncio.Event(), asyncio.Event()
        self._task = loop.create_task(self._run(), name="strop-feedback-batcher")
        if not self._exit_hook_registered:
            atexit.register(self._at_exit)
            self._exit_hook_registered = True

    async def _sleep(self, seconds: float) -> None:
        assert self._closing is not None
        if self._closing.is_set():
            await asyncio.sleep(seconds)  # the retry loop never sleeps past the close deadline
            return
        try:
            await asyncio.wait_for(self._closing.wait(), seconds)  # close() cuts a backoff short
        except asyncio.TimeoutError:
            pass

    async def _run(self) -> None:
        assert self._wake is not None and self._settled is not None
        while True:
            now = time.monotonic()
            closing = self._closed
            if closing and self._deadline is not None and now >= self._deadline:
                return  # close() fails what is left
            if self._queue.due(now, flush_upto=self._flush_upto, closing=closing):
                batch = self._queue.take()
                steps = delivery(batch, self._config, self.options, self._http, deadline=lambda: self._deadline)
                try:
                    settlements = await run_async(
                        self._http,
                        steps,
                        sleep=self._sleep,
                        before_send=lambda request: clamp_timeout(request, self._deadline),
                    )
                except asyncio.CancelledError:
                    self._queue.requeue(batch)
                    raise
                except Exception as exc:  # a bug must not kill the sender: the batch fails, recorded
                    settlements = [Settlement(batch, None, StropError(f"unexpected error: {exc!r}"))]
                rejected, failed = self._queue.settle(settlements)
                try:
                    report(self.options, rejected, failed)
                finally:
                    self._queue.reporting = False
                    self._settled.set()
                continue
            if closing and not self._queue.pending:
                return
            self._wake.clear()
            try:
                await asyncio.wait_for(self._wake.wait(), self._queue.wait_time(now))
            except asyncio.TimeoutError:
                pass

    def _at_exit(self) -> None:
        """The loop is gone (``asyncio.run`` returned, its tasks cancelled): send what is left
        with a short-lived sync client, within ``close_timeout``."""
        self._closed = True
        if not self._queue.pending:
            return
        deadline = time.monotonic() + self.options.close_timeout
        with httpx.Client(timeout=self._config.http_timeout) as http:
            while self._queue.pending and time.monotonic() < deadline:
                batch = self._queue.take()
                settlements = deliver_sync(http, self._config, self.options, batch, deadline=lambda: deadline)
                report(self.options, *self._queue.settle(settlements))
                self._queue.reporting = False
        failed = self._queue.abandon_pending("not delivered before the batcher's close timeout at exit")
        report(self.options, [], [failed] if failed else [])
