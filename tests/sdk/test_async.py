"""The asyncio client on the same core paths. Each test runs its coroutine with ``asyncio.run``
and checks the database outside it (the ORM is synchronous)."""

from __future__ import annotations

import asyncio
import time

import pytest
from strop import AsyncStrop, BadRequestError, BatcherOptions, NotFoundError

from apps.interactions.models import Feedback, Interaction
from tests.sdk.conftest import closed_port

pytestmark = pytest.mark.django_db(transaction=True)


def items(count: int, prefix: str = "a") -> list[dict]:
    return [{"client_id": f"{prefix}-{n}", "prompt": "x = ", "completion": str(n)} for n in range(count)]


def test_async_client_logs_reads_and_pages(api):
    async def main() -> dict:
        async with AsyncStrop(base_url=api.url, api_key=api.key) as client:
            one = await client.interactions.log(client_id="one", prompt="x = ", completion="1", end_user_id="dev")
            replay = await client.interactions.log(client_id="one", prompt="x = ", completion="1")
            batch = await client.interactions.log_batch(items(4) + [{"client_id": "bad", "completion": "1"}])
            read = await client.interactions.get(one.id)
            first = await client.interactions.list(limit=3)
            second = await client.interactions.list(limit=3, offset=first.next_offset)
            with pytest.raises(NotFoundError):
                await client.interactions.get("00000000-0000-0000-0000-000000000000")
            return {"one": one, "replay": replay, "batch": batch, "read": read, "pages": (first, second)}

    got = asyncio.run(main())
    assert got["one"].created is True and got["replay"].created is False and got["replay"].id == got["one"].id
    assert got["batch"].counts == {"created": 4, "duplicate": 0, "rejected": 1}
    assert got["batch"].rejected[0].error.field == "prompt"
    assert got["read"].end_user_id == "dev"
    first, second = got["pages"]
    assert first.count == 5 and len(first.results) == 3 and len(second.results) == 2 and second.next_offset is None
    assert Interaction.objects.filter(tenant=api.tenant).count() == 5


def test_async_feedback_send_and_typed_errors(api):
    async def main() -> tuple:
        async with AsyncStrop(base_url=api.url, api_key=api.key) as client:
            await client.interactions.log(client_id="c-1", prompt="x = ", completion="1")
            sent = await client.feedback.send(client_id="c-1", outcome="accepted")
            try:
                await client.feedback.send(client_id="c-1", outcome="maybe")
            except BadRequestError as exc:
                return sent, exc
        raise AssertionError("a bad outcome was accepted")

    sent, error = asyncio.run(main())
    assert sent.status == "recorded"
    assert (error.status, error.code, error.field) == (400, "invalid", "outcome")
    assert Feedback.objects.filter(tenant=api.tenant).count() == 1


def test_async_batcher_delivers_every_event_once_and_close_sends_the_rest(api, traffic):
    async def main() -> tuple:
        options = BatcherOptions(batch_size=25, flush_interval=3600)
        http = traffic.async_client(timeout=60)
        client = AsyncStrop(base_url=api.url, api_key=api.key, http_client=http, feedback_batching=options)
        await client.interactions.log_batch(items(60, prefix="f"))
        for n in range(50):
            client.feedback.enqueue(client_id=f"f-{n}", outcome="accepted")
        flushed = await client.feedback.flush(timeout=120)
        for n in range(50, 60):
            client.feedback.enqueue(client_id=f"f-{n}", outcome="rejected")
        before_close = client.feedback.batcher.stats
        await client.close()
        await http.aclose()  # ours: the client leaves it open
        return flushed, before_close, client.feedback.batcher.stats

    flushed, before_close, after = asyncio.run(main())
    assert flushed is True and before_close.queued == 10
    assert (after.enqueued, after.delivered, after.failed, after.dropped, after.queued) == (60, 60, 0, 0, 0)
    assert traffic.requests("/v1/feedback") == 3  # two full batches, then the ten close sent
    rows = Feedback.objects.filter(tenant=api.tenant)
    assert rows.filter(outcome="accepted").count() == 50 and rows.filter(outcome="rejected").count() == 10
    assert set(rows.values_list("events_received", flat=True)) == {1}


def test_async_enqueue_never_blocks_when_the_server_is_down(api):
    async def main() -> tuple:
        options = BatcherOptions(batch_size=10, max_queue=50, flush_interval=0.0, max_attempts=3, close_timeout=1.0)
        client = AsyncStrop(
            base_url=f"http://127.0.0.1:{closed_port()}", api_key=api.key, timeout=2.0, feedback_batching=options
        )
        slowest, largest_queue = 0.0, 0
        for n in range(2000):
            started = time.monotonic()
            client.feedback.enqueue(client_id=f"c-{n}", outcome="accepted")
            slowest = max(slowest, time.monotonic() - started)
            largest_queue = max(largest_queue, client.feedback.batcher.stats.queued)
            if n % 100 == 0:
                await asyncio.sleep(0)  # let the sender run and fail
        closed = await client.feedback.batcher.close()
        await client.close()
        return slowest, largest_queue, closed, client.feedback.batcher.stats

    slowest, largest_queue, closed, stats = asyncio.run(main())
    assert slowest < 1.0 and largest_queue <= 50
    assert closed is False and stats.delivered == 0
    assert stats.queued == 0 and stats.in_flight == 0 and stats.failed + stats.dropped == 2000
