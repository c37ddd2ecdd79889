"""When an open stream's parts are written (apps.serving.stream_record): never after its end."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest

from apps.interactions.models import StreamPart
from apps.serving import stream_record, sync_work
from apps.serving.stream_record import StreamRecord


def _record() -> StreamRecord:
    return StreamRecord(1, [uuid.uuid4()], started=time.perf_counter(), head=lambda index: (), since=lambda cursors: [])


def test_a_streams_end_waits_for_the_part_write_in_flight(monkeypatch, settings):
    """A write in flight when the stream ends (vLLM failed it, or it finished) commits before the end
    deletes the parts: never after, where its part would outlive the stream."""
    settings.STROP_SERVING_RECORD_EVERY_S = 0.01
    monkeypatch.setattr(sync_work, "_pooled", True)  # the ASGI server's threads: the write and the end race
    order: list[str] = []
    writing = threading.Event()

    def slow_write(jobs: list) -> set[int]:
        writing.set()
        time.sleep(0.3)
        order.append("part written")
        return set()

    monkeypatch.setattr(stream_record, "_write", slow_write)

    async def stream() -> None:
        record = _record()
        record.since = lambda cursors: [(0, stream_record.Piece("a", [1], [-0.1], {}), 1)]
        record.served()
        while not writing.is_set():
            await asyncio.sleep(0.01)
        assert record.end()
        await record.then(order.append, "parts deleted")

    asyncio.run(stream())
    assert order == ["part written", "parts deleted"]


def test_a_failed_part_write_does_not_stop_the_streams_end():
    async def stream() -> str:
        record = _record()
        record.writing = asyncio.get_running_loop().create_future()
        record.writing.set_exception(RuntimeError("the pool is gone"))
        return await record.then(lambda: "recorded")

    assert asyncio.run(stream()) == "recorded"


def test_a_cancelled_part_write_does_not_stop_the_streams_end():
    async def stream() -> str:
        record = _record()
        record.writing = asyncio.get_running_loop().create_future()
        record.writing.cancel()  # the flusher's task cancelled (its loop shutting down)
        return await record.then(lambda: "recorded")

    assert asyncio.run(stream()) == "recorded"


@pytest.mark.django_db
def test_a_job_whose_part_cannot_be_made_costs_no_other_job_its_write(make_tenant):
    tenant = make_tenant()
    good, broken = _record(), _record()
    good.tenant_id = broken.tenant_id = tenant.pk
    broken.ids = []  # a bug: no id for its choice (an IndexError, no database error)
    piece = stream_record.Piece("a", [1], [-0.1], {})
    jobs = [stream_record._Job(record, 0, 1, piece, 1) for record in (broken, good)]
    assert stream_record._write([(job, None) for job in jobs]) == {0}
    assert list(StreamPart.objects.values_list("interaction_id", flat=True)) == good.ids
