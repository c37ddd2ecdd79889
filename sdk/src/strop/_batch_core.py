"""The feedback batcher's bookkeeping and delivery, shared by the thread and the asyncio batcher.

Backpressure policy: the queue holds at most ``max_queue`` events; when it is full, enqueueing
drops the *oldest* queued event and counts it in ``stats.dropped`` (with a warning in the log,
once per overflow). Enqueueing never blocks and memory never grows past the bound. Events are
encoded to JSON at enqueue, in the caller, so a value that cannot be sent fails there.

Every event ends in exactly one of: delivered (the API recorded it, or keeps it as pending until
its interaction arrives), rejected (the API refused the item in its 207 answer; not retried,
kept in ``rejected``), failed (no delivery after ``max_attempts``, a non-retryable answer, or
the close deadline; kept in ``failures``) or dropped (overflow). So at any time
``enqueued == delivered + rejected + failed + dropped + queued + in_flight``.
"""

from __future__ import annotations

import json
import logging
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, Callable, Optional

import httpx

from strop import _api
from strop._core import ClientConfig, RetryPolicy, Step, attempts
from strop._exceptions import PayloadTooLargeError, StropError
from strop._types import BatchResult, ItemError

logger = logging.getLogger("strop")

MAX_BATCH_ITEMS = 1000  # the API's default STROP_MAX_BATCH_ITEMS


@dataclass(frozen=True)
class RejectedEvent:
    """An event the API refused (bad outcome, unknown interaction...): it is never retried."""

    item: dict[str, Any]
    error: ItemError


@dataclass(frozen=True)
class FailedBatch:
    """Events that were not delivered, and the last error (``error.status_code`` None: no answer)."""

    items: list[dict[str, Any]]
    error: StropError


@dataclass(frozen=True)
class BatcherStats:
    enqueued: int
    delivered: int
    rejected: int
    failed: int
    dropped: int
    queued: int
    in_flight: int


@dataclass(frozen=True)
class BatcherOptions:
    """How the feedback batcher sends.

    batch_size: events per request (at most 1000, the API's batch limit).
    flush_interval: seconds the oldest queued event may wait before a partial batch is sent.
    max_queue: events held in memory; when full, the oldest is dropped (see ``stats.dropped``).
    max_batch_bytes: a batch is cut before its body passes this size (the API takes 16 MiB).
    max_attempts: tries per batch on 429 / 502 / 503 / 504 / connection errors before it fails.
    initial_backoff, max_backoff: exponential backoff with jitter between tries, in seconds.
    max_retry_after: a ``Retry-After`` is honoured up to this many seconds; a longer one fails the batch.
    close_timeout: how long ``close()`` (and interpreter exit) keeps trying to deliver.
    max_recorded: how many rejected events and failed batches are kept for inspection.
    on_rejected, on_failed: called from the batcher (its thread, or its task) with what was
        rejected or failed; exceptions they raise are logged, never propagated.
    """

    batch_size: int = 100
    flush_interval: float = 1.0
    max_queue: int = 10_000
    max_batch_bytes: int = 4 * 1024 * 1024
    max_attempts: int = 8
    initial_backoff: float = 0.5
    max_backoff: float = 30.0
    max_retry_after: float = 300.0
    close_timeout: float = 10.0
    max_recorded: int = 1000
    on_rejected: Callable[[list[RejectedEvent]], None] | None = None
    on_failed: Callable[[FailedBatch], None] | None = None

    def __post_init__(self) -> None:
        if not 1 <= self.batch_size <= MAX_BATCH_ITEMS:
            raise ValueError(f"batch_size must be from 1 to {MAX_BATCH_ITEMS}")
        if self.max_queue < 1 or self.max_attempts < 1:
            raise ValueError("max_queue and max_attempts must be at least 1")
        if self.flush_interval < 0 or self.close_timeout < 0:
            raise ValueError("flush_interval and close_timeout must not be negative")

    @property
    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(
            max_retries=self.max_attempts - 1,
            initial_delay=self.initial_backoff,
            max_delay=self.max_backoff,
            max_retry_after=self.max_retry_after,
        )


@dataclass
class QueuedEvent:
    seq: int
    encoded: bytes
    enqueued_at: float

    def item(self) -> dict[str, Any]:
        item: dict[str, Any] = json.loads(self.encoded)
        return item


@dataclass
class Settlement:
    """How a batch ended: the API's answer, or the error that ended its tries."""

    events: list[QueuedEvent]
    result: BatchResult | None
    error: StropError | None


class FeedbackQueue:
    """Bounded FIFO of encoded events, the batch in flight, and the counters. Not thread-safe:
    the thread batcher holds its lock around every call; the asyncio one runs on one loop."""

    def __init__(self, options: BatcherOptions) -> None:
        self.options = options
        self.pending: deque[QueuedEvent] = deque()
        self.in_flight: list[QueuedEvent] = []
        self.next_seq = 0
        self.delivered = self.rejected = self.failed = self.dropped = 0
        self.rejected_events: deque[RejectedEvent] = deque(maxlen=options.max_recorded)
        self.failures: deque[FailedBatch] = deque(maxlen=options.max_recorded)
        # Between settling a batch and the end of its report (logs, hooks): a flush waits for both.
        self.reporting = False
        self._overflowing = False

    def push(self, encoded: bytes, now: float) -> None:
        if len(self.pending) >= self.options.max_queue:
            self.pending.popleft()
            self.dropped += 1
            if not self._overflowing:
                self._overflowing = True
                logger.warning(
                    "strop feedback queue is full (%d events): dropping the oldest until it drains",
                    self.options.max_queue,
                )
        elif self._overflowing and len(self.pending) < self.options.max_queue // 2:
            self._overflowing = False
        self.pending.append(QueuedEvent(self.next_seq, encoded, now))
        self.next_seq += 1

    def wants_wake(self) -> bool:
        """After a push: should the sender look now? (the first event starts the interval clock,
        a full batch is ready)."""
        return len(self.pending) == 1 or len(self.pending) == self.options.batch_size

    def due(self, now: float, *, flush_upto: int, closing: bool) -> bool:
        if not self.pending:
            return False
        head = self.pending[0]
        return (
            closing
            or len(self.pending) >= self.options.batch_size
            or head.seq < flush_upto
            or now - head.enqueued_at >= self.options.flush_interval
        )

    def wait_time(self, now: float) -> float | None:
        """Seconds until the oldest event is due by age; None when the queue is empty."""
        if not self.pending:
            return None
        return max(0.0, self.pending[0].enqueued_at + self.options.flush_interval - now)

    def take(self) -> list[QueuedEvent]:
        batch: list[QueuedEvent] = []
        size = 0
        while self.pending and len(batch) < self.options.batch_size:
            event = self.pending[0]
            if batch and size + len(event.encoded) + 1 > self.options.max_batch_bytes:
                break
            batch.append(self.pending.popleft())
            size += len(event.encoded) + 1
        self.in_flight = batch
        return batch

    def requeue(self, batch: list[QueuedEvent]) -> None:
        """Put a batch that was interrupted (its task cancelled) back at the front."""
        self.pending.extendleft(reversed(batch))
        self.in_flight = []

    def settle(self, settlements: list[Settlement]) -> tuple[list[RejectedEvent], list[FailedBatch]]:
        rejected: list[RejectedEvent] = []
        failed: list[FailedBatch] = []
        for settlement in settlements:
            if settlement.result is None:
                error = settlement.error or StropError("feedback batch was not delivered")
                failed.append(FailedBatch([e.item() for e in settlement.events], error))
                self.failed += len(settlement.events)
                continue
            verdicts = {r.index: r for r in settlement.result.results}
            for index, event in enumerate(settlement.events):
                verdict = verdicts.get(index)
                if verdict is not None and verdict.status == "rejected":
                    reason = verdict.error or ItemError("rejected", "the API rejected this event", None)
                    rejected.append(RejectedEvent(event.item(), reason))
                else:
                    self.delivered += 1
        self.rejected += len(rejected)
        self.rejected_events.extend(rejected)
        self.failures.extend(failed)
        self.in_flight = []
        self.reporting = True
        return rejected, failed

    def abandon_pending(self, reason: str) -> FailedBatch | None:
        """Fail every queued event at once (the close deadline passed)."""
        if not self.pending:
            return None
        events = list(self.pending)
        self.pending.clear()
        failed = FailedBatch([e.item() for e in events], StropError(reason))
        self.failed += len(events)
        self.failures.append(failed)
        return failed

    def settled_through(self, target: int) -> bool:
        """Has every event enqueued before sequence number ``target`` ended one way or another
        (and been reported)?"""
        if self.reporting or (self.pending and self.pending[0].seq < target):
            return False
        return not any(event.seq < target for event in self.in_flight)

    def lost(self) -> int:
        """Events that failed or were dropped so far: a flush or close that saw this grow did not
        get everything through."""
        return self.failed + self.dropped

    def stats(self) -> BatcherStats:
        return BatcherStats(
            enqueued=self.next_seq,
            delivered=self.delivered,
            rejected=self.rejected,
            failed=self.failed,
            dropped=self.dropped,
            queued=len(self.pending),
            in_flight=len(self.in_flight),
        )


Delivery = Generator[Step, Optional[httpx.Response], list[Settlement]]


def delivery(
    events: list[QueuedEvent],
    config: ClientConfig,
    options: BatcherOptions,
    http: httpx.Client | httpx.AsyncClient,
    *,
    deadline: Callable[[], float | None],
) -> Delivery:
    """Send one batch with the batcher's retry policy (driven like :func:`strop._core.attempts`).
    A 413 splits the batch in halves, down to single events; any other error fails the batch."""
    call = _api.feedback_send_encoded([event.encoded for event in events])
    request = call.build(config, http)
    try:
        response = yield from attempts(request, options.retry_policy, idempotent=True, deadline=deadline)
        return [Settlement(events, call.parse(response), None)]
    except PayloadTooLargeError as exc:
        if len(events) == 1:
            return [Settlement(events, None, exc)]
        half = len(events) // 2
        first = yield from delivery(events[:half], config, options, http, deadline=deadline)
        second = yield from delivery(events[half:], config, options, http, deadline=deadline)
        return first + second
    except StropError as exc:
        return [Settlement(events, None, exc)]


def report(options: BatcherOptions, rejected: list[RejectedEvent], failed: list[FailedBatch]) -> None:
    """Log what was rejected or failed and call the user's hooks (their errors are logged only)."""
    if rejected:
        first = rejected[0].error
        logger.warning(
            "strop rejected %d feedback event(s); first: %s (field %s)", len(rejected), first.message, first.field
        )
        _call_hook(options.on_rejected, rejected)
    for batch in failed:
        logger.error("strop could not deliver %d feedback event(s): %s", len(batch.items), batch.error)
        _call_hook(options.on_failed, batch)


def _call_hook(hook: Callable[[Any], None] | None, value: Any) -> None:
    if hook is None:
        return
    try:
        hook(value)
    except Exception:
        logger.exception("strop feedback batcher hook %r raised", hook)
