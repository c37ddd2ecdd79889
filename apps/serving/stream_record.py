"""An open stream's record as it is served, so that a worker killed outright (SIGKILL, the OOM
killer, a crash) loses only what its streams served since their last write.

Each API process appends what its open streams served since their last write as parts
(``apps.interactions.stream_parts``), every ``STROP_SERVING_RECORD_EVERY_S``, every stream that sent
a chunk since in one statement, on a serving database thread: the stream itself never waits for it,
and a write that fails (Postgres slow or down, one bad part) is made good by the next one or by the
stream's end, which records its interactions as it always did. A part holds only what is new (the
first also what the interaction will be, less what was served), so a write costs what was served
since, never the whole text again. A stream that ends within the interval of its first chunk
writes no part at all.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
import uuid
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from django.conf import settings

from apps.interactions.stream_parts import Part, stream_part_head, stream_parts_write
from apps.serving.sync_work import in_db_thread, pooled

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Rows per statement (9 parameters each): well under Postgres's 65,535 parameters.
BATCH_PARTS = 1000


@dataclass
class Piece:
    """What one choice served since a write: its text, tokens and logprobs, and its metadata now
    (finish reason; its tool calls' new argument text) if it has any."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    metadata: dict[str, Any]


# The pieces each choice served since its cursor (each choice's own, from the stream's code), with
# the cursor after them: taken on the event loop, so they are copies the stream no longer touches.
Since = Callable[[dict[int, Any]], list[tuple[int, Piece, Any]]]


class StreamRecord:
    """When an open stream's parts are written. ``head(index)`` (on a database thread) is the row
    :func:`apps.interactions.served.served_rows` makes of choice ``index`` with nothing served."""

    def __init__(
        self, tenant_id: int, ids: list[uuid.UUID], *, started: float, head: Callable[[int], tuple], since: Since
    ) -> None:
        self.tenant_id, self.ids, self.started, self.head, self.since = tenant_id, ids, started, head, since
        self.cursors: dict[int, Any] = {}
        self.seqs: dict[int, int] = {}
        self.dirty = False  # served more since the last write took it
        self.first_served: float | None = None  # when its first chunk went out (the loop's clock)
        self.written = False  # a part of it may be in the database
        self.ended = False
        self.writing: asyncio.Future[set[int]] | None = None  # the write that took its parts last

    def served(self) -> None:
        """A chunk went to the client: the next write takes it. Only under the ASGI server: anywhere
        else a stream is read whole before anything is sent (``apps.serving.async_views``)."""
        if not self.dirty and not self.ended and pooled():
            self.dirty = True
            flusher = _flusher()
            if self.first_served is None:
                self.first_served = asyncio.get_running_loop().time()
            flusher.add(self)

    def end(self) -> bool:
        """The stream ended: no more parts. Whether any may have been written (its end then records
        over them: ``apps.interactions.stream_parts.stream_parts_recorded``)."""
        self.ended = True
        if self.dirty or self.written:
            _flusher().remove(self)
        return self.written

    async def then(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn`` on a database thread once the write that took this stream's parts last is done:
        its end (the record, or a failure's discard) must never run before it, or a part committed
        after its end deleted them would outlive the stream, and the sweeper would record it."""
        if self.writing is not None:
            # Done however it ended (failed, cancelled: the flusher logs it; the end's work is the same),
            # and never cancelled by this wait: it is the flusher's.
            await asyncio.wait([self.writing])
        return await in_db_thread(fn, *args, **kwargs)


@dataclass
class _Job:
    record: StreamRecord
    index: int
    seq: int
    piece: Piece
    cursor: Any


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
            try:
                jobs = self._due()
            except Exception:  # a bug in a stream's snapshot must not stop the others' writes
                logger.exception("open streams' parts not taken")
                continue
            if not jobs:
                continue
            write = asyncio.ensure_future(
                in_db_thread(_write, [(job, job.record.head if job.seq == 0 else None) for job in jobs])
            )
            for job in jobs:
                job.record.writing = write  # its end waits for it (StreamRecord.then)
            try:
                failed = await write
            except Exception as exc:  # the thread pool itself: every job is retried
                logger.warning("open streams' parts not written (their next write or their end does it): %s", exc)
                failed = set(range(len(jobs)))
            for position, job in enumerate(jobs):
                if position in failed:
                    job.record.dirty = True  # the next write takes it again, with what came since
                    continue
                job.record.cursors[job.index], job.record.seqs[job.index] = job.cursor, job.seq + 1

    def _due(self) -> list[_Job]:
        jobs = []
        now = time.perf_counter()
        # A stream younger than the interval waits for the next write: most end before it, and then
        # they cost nothing more than their end's record.
        young = asyncio.get_running_loop().time() - settings.STROP_SERVING_RECORD_EVERY_S
        for record in [r for r in self.records if r.dirty and (r.first_served or 0) <= young]:
            record.dirty = False
            record.written = True  # from now on its end records over its parts
            for index, piece, cursor in record.since(record.cursors):
                piece.metadata["latency_ms"] = (now - record.started) * 1000
                jobs.append(_Job(record, index, record.seqs.get(index, 0), piece, cursor))
        return jobs


def _write(jobs: list[tuple[_Job, Callable[[int], tuple] | None]]) -> set[int]:
    """Write the jobs' parts; the positions of those not written. One job whose part cannot be made
    (a bug, a value that is no JSON) costs no other its write."""
    failed: set[int] = set()
    parts: list[tuple[int, Part]] = []
    for position, (job, head_of) in enumerate(jobs):
        try:
            parts.append((position, _part(job, head_of)))
        except Exception:
            logger.exception("an open stream's part not made")
            failed.add(position)
    for start in range(0, len(parts), BATCH_PARTS):
        chunk = parts[start : start + BATCH_PARTS]
        failed |= {chunk[i][0] for i in stream_parts_write([part for _, part in chunk])}
    return failed


def _part(job: _Job, head_of: Callable[[int], tuple] | None) -> Part:
    head, metadata = None, job.piece.metadata
    if head_of is not None:
        head, metadata = stream_part_head(head_of(job.index))
        metadata.update(job.piece.metadata)
    record = job.record
    piece = job.piece
    return Part(
        record.tenant_id, record.ids[job.index], job.seq, piece.text, piece.token_ids, piece.logprobs, metadata, head
    )


_flushers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Flusher] = weakref.WeakKeyDictionary()


def _flusher() -> _Flusher:
    loop = asyncio.get_running_loop()
    flusher = _flushers.get(loop)
    if flusher is None:
        flusher = _flushers[loop] = _Flusher()
    return flusher
