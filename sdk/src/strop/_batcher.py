"""The feedback batcher of the sync client: one background thread sends what callers enqueue.
The policy (bounded queue, drop-oldest, retries, what ends where) is in ``_batch_core``."""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any, Callable

import httpx

from strop._batch_core import (
    BatcherOptions,
    BatcherStats,
    FailedBatch,
    FeedbackQueue,
    QueuedEvent,
    RejectedEvent,
    Settlement,
    delivery,
    report,
)
from strop._core import ClientConfig, encode_json
from strop._drivers import run_sync
from strop._exceptions import StropError

logger = logging.getLogger("strop")

__all__ = ["FeedbackBatcher"]


def clamp_timeout(request: httpx.Request, deadline: float | None) -> None:
    """Near a close deadline, no single try may wait past it for a server that does not answer."""
    if deadline is None:
        return
    remaining = max(0.05, deadline - time.monotonic())
    timeout = request.extensions.get("timeout") or dict.fromkeys(("connect", "read", "write", "pool"))
    request.extensions["timeout"] = {k: remaining if v is None else min(v, remaining) for k, v in timeout.items()}


def deliver_sync(
    http: httpx.Client,
    config: ClientConfig,
    options: BatcherOptions,
    batch: list[QueuedEvent],
    *,
    deadline: Callable[[], float | None],
    sleep: Callable[[float], Any] = time.sleep,
) -> list[Settlement]:
    steps = delivery(batch, config, options, http, deadline=deadline)
    try:
        return run_sync(http, steps, sleep=sleep, before_send=lambda request: clamp_timeout(request, deadline()))
    except Exception as exc:  # a bug must not kill the sender: the batch fails, and is recorded
        logger.exception("strop feedback batcher: unexpected error")
        return [Settlement(batch, None, StropError(f"unexpected error while sending feedback: {exc!r}"))]


class FeedbackBatcher:
    """Collects feedback events and sends them in batches from a background thread.

    :meth:`enqueue` never blocks (see ``BatcherOptions`` for the bounded queue and what happens
    when it is full); :meth:`flush` waits for what was enqueued so far; :meth:`close` flushes
    within ``close_timeout`` and stops the thread. An ``atexit`` hook closes it at interpreter
    exit, so events enqueued just before exit are still sent.
    """

    def __init__(self, *, http: httpx.Client, config: ClientConfig, options: BatcherOptions | None = None) -> None:
        self.options = options or BatcherOptions()
        self._http = http
        self._config = config
        self._queue = FeedbackQueue(self.options)
        self._cond = threading.Condition()
        self._closing = threading.Event()
        self._deadline: float | None = None
        self._flush_upto = 0
        self._closed = False
        self._thread: threading.Thread | None = None

    # ---- callers ----

    def enqueue(self, item: Mapping[str, Any]) -> None:
        """Queue one feedback event (the API's fields). Raises ``TypeError`` / ``ValueError`` at
        once for a value JSON cannot carry, and ``RuntimeError`` after :meth:`close`."""
        encoded = encode_json(dict(item))
        with self._cond:
            if self._closed:
                raise RuntimeError("the feedback batcher is closed")
            self._queue.push(encoded, time.monotonic())
            if self._thread is None:
                self._start()
            if self._queue.wants_wake():
                self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Send what is queued now and wait until every event enqueued before this call has ended
        (delivered, rejected, failed or dropped). True when they were all delivered or rejected by
        the API; False when ``timeout`` (seconds) ran out first or some failed or were dropped."""
        with self._cond:
            target, lost = self._queue.next_seq, self._queue.lost()
            self._flush_upto = max(self._flush_upto, target)
            self._cond.notify_all()
            settled = self._cond.wait_for(lambda: self._queue.settled_through(target), timeout)
            return settled and self._queue.lost() == lost

    def close(self, timeout: float | None = None) -> bool:
        """Stop accepting events, keep delivering for up to ``timeout`` seconds (default
        ``close_timeout``), then fail what is left (``stats.failed``, ``failures``). True when
        everything held at close was delivered or rejected by the API."""
        timeout = self.options.close_timeout if timeout is None else timeout
        with self._cond:
            lost = self._queue.lost()
            if not self._closed:
                self._closed = True
                self._deadline = time.monotonic() + timeout
                self._closing.set()
                self._cond.notify_all()
            deadline = self._deadline or time.monotonic()
            thread = self._thread
        atexit.unregister(self._at_exit)
        if thread is not None and thread is not threading.current_thread():
            thread.join(max(0.0, deadline - time.monotonic()) + 1.0)
        with self._cond:
            # A try that started before close may outlive the deadline (its own timeout is not
            # cut): what is still queued behind it fails now, so close() never leaves it queued.
            abandoned = None
            if time.monotonic() >= deadline:
                abandoned = self._queue.abandon_pending("not delivered before the batcher's close timeout")
                self._cond.notify_all()
            done = self._queue.settled_through(self._queue.next_seq) and self._queue.lost() == lost
        if abandoned is not None:
            report(self.options, [], [abandoned])
        return done

    @property
    def stats(self) -> BatcherStats:
        with self._cond:
            return self._queue.stats()

    @property
    def rejected(self) -> list[RejectedEvent]:
        """The most recent rejected events (up to ``max_recorded``)."""
        with self._cond:
            return list(self._queue.rejected_events)

    @property
    def failures(self) -> list[FailedBatch]:
        """The most recent failed batches (up to ``max_recorded``), with their events, to resend."""
        with self._cond:
            return list(self._queue.failures)

    # ---- the sender thread ----

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="strop-feedback-batcher", daemon=True)
        self._thread.start()
        atexit.register(self._at_exit)

    def _at_exit(self) -> None:
        self.close()

    def _sleep(self, seconds: float) -> None:
        if self._closing.is_set():
            time.sleep(seconds)  # the retry loop never sleeps past the close deadline
        else:
            self._closing.wait(seconds)  # close() cuts a backoff short

    def _next_batch(self) -> tuple[list[QueuedEvent] | None, FailedBatch | None]:
        """Wait until a batch is due and take it (None when closed and empty); past the close
        deadline, fail what is still queued instead."""
        with self._cond:
            while True:
                closing = self._closing.is_set()
                now = time.monotonic()
                if closing and self._deadline is not None and now >= self._deadline:
                    failed = self._queue.abandon_pending("not delivered before the batcher's close timeout")
                    self._cond.notify_all()
                    return None, failed
                if self._queue.due(now, flush_upto=self._flush_upto, closing=closing):
                    return self._queue.take(), None
                if closing and not self._queue.pending:
                    self._cond.notify_all()
                    return None, None
                self._cond.wait(self._queue.wait_time(now))

    def _run(self) -> None:
        while True:
            batch, abandoned = self._next_batch()
            if batch is None:
                report(self.options, [], [abandoned] if abandoned else [])
                return
            settlements = deliver_sync(
                self._http, self._config, self.options, batch, deadline=lambda: self._deadline, sleep=self._sleep
            )
            with self._cond:
                rejected, failed = self._queue.settle(settlements)
            try:
                report(self.options, rejected, failed)
            finally:
                with self._cond:
                    self._queue.reporting = False
                    self._cond.notify_all()
