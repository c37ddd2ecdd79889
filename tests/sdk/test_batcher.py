"""The background feedback batcher of the sync client."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
import uuid

import pytest
from strop import BatcherOptions, Strop

from apps.interactions.models import Feedback
from tests.sdk.conftest import closed_port, wait_until

pytestmark = pytest.mark.django_db(transaction=True)

NEVER = 3600.0  # a flush interval no test reaches: batches leave only when full, flushed or closed


def log_interactions(client: Strop, count: int, prefix: str = "i") -> list[str]:
    items = [{"client_id": f"{prefix}-{n}", "prompt": "x = ", "completion": str(n)} for n in range(count)]
    result = client.interactions.log_batch(items)
    assert result.counts["created"] == count
    return [f"{prefix}-{n}" for n in range(count)]


def test_every_enqueued_event_is_delivered_exactly_once(api, traffic):
    options = BatcherOptions(batch_size=40, flush_interval=NEVER)
    with Strop(
        base_url=api.url, api_key=api.key, http_client=traffic.client(timeout=60), feedback_batching=options
    ) as client:
        client_ids = log_interactions(client, 250)
        for client_id in client_ids:
            client.feedback.enqueue(client_id=client_id, outcome="accepted")
        assert client.feedback.flush(timeout=120) is True
        stats = client.feedback.batcher.stats
    assert (stats.enqueued, stats.delivered, stats.failed, stats.dropped, stats.rejected) == (250, 250, 0, 0, 0)
    assert traffic.requests("/v1/feedback") == 7  # six full batches of 40 and the flushed 10
    rows = Feedback.objects.filter(tenant=api.tenant)
    assert rows.count() == 250
    assert set(rows.values_list("events_received", flat=True)) == {1}
    assert not rows.filter(interaction__isnull=True).exists()


def test_close_sends_what_is_still_queued(api):
    options = BatcherOptions(batch_size=1000, flush_interval=NEVER)
    client = Strop(base_url=api.url, api_key=api.key, feedback_batching=options)
    for client_id in log_interactions(client, 10):
        client.feedback.enqueue(client_id=client_id, outcome="rejected")
    assert not Feedback.objects.filter(tenant=api.tenant).exists()  # neither full nor flushed yet
    client.close()
    assert Feedback.objects.filter(tenant=api.tenant, outcome="rejected").count() == 10
    with pytest.raises(RuntimeError):
        client.feedback.enqueue(client_id="late", outcome="accepted")


def test_rejected_events_are_reported_and_not_retried(api, traffic):
    seen = []
    options = BatcherOptions(batch_size=1000, flush_interval=NEVER, on_rejected=seen.extend)
    with Strop(
        base_url=api.url, api_key=api.key, http_client=traffic.client(timeout=60), feedback_batching=options
    ) as client:
        good = log_interactions(client, 3)
        for client_id in good:
            client.feedback.enqueue(client_id=client_id, outcome="accepted")
        client.feedback.enqueue(client_id=good[0], outcome="maybe")
        client.feedback.enqueue(interaction_id=str(uuid.uuid4()), outcome="accepted")
        assert client.feedback.flush(timeout=120) is True
        batcher = client.feedback.batcher
        assert (batcher.stats.delivered, batcher.stats.rejected, batcher.stats.failed) == (3, 2, 0)
        assert [(r.error.field, r.item["outcome"]) for r in batcher.rejected] == [
            ("outcome", "maybe"),
            ("interaction_id", "accepted"),
        ]
        assert seen == batcher.rejected
    assert traffic.requests("/v1/feedback") == 1
    assert Feedback.objects.filter(tenant=api.tenant).count() == 3


@pytest.mark.parametrize("server", ["refusing", "silent"])
def test_enqueue_never_blocks_and_memory_stays_bounded_when_the_server_is_down(server, api, request):
    url = f"http://127.0.0.1:{closed_port()}" if server == "refusing" else request.getfixturevalue("silent_url")
    options = BatcherOptions(batch_size=10, max_queue=100, flush_interval=0.0, max_attempts=3, close_timeout=1.0)
    client = Strop(base_url=url, api_key=api.key, timeout=2.0, feedback_batching=options)
    batcher = client.feedback.batcher
    slowest, largest_queue = 0.0, 0
    for n in range(5000):
        started = time.monotonic()
        client.feedback.enqueue(client_id=f"c-{n}", outcome="accepted")
        slowest = max(slowest, time.monotonic() - started)
        largest_queue = max(largest_queue, batcher.stats.queued)
    assert slowest < 1.0  # a lock held for bookkeeping only; never a network wait
    stats = batcher.stats
    assert largest_queue <= 100 and stats.in_flight <= 10
    assert stats.dropped + stats.failed >= 5000 - 100 - 10 and stats.delivered == 0

    started = time.monotonic()
    assert client.feedback.batcher.close() is False  # nothing could be delivered
    assert time.monotonic() - started < 30
    assert batcher.stats.queued == 0  # what no try took is failed by close() itself
    assert wait_until(lambda: batcher.stats.in_flight == 0, timeout=30)  # a try begun before close ends
    stats = batcher.stats
    assert stats.queued == 0 and stats.failed + stats.dropped == 5000
    assert sum(len(batch.items) for batch in batcher.failures) == stats.failed


SCRIPT = """
import asyncio, sys
from strop import AsyncStrop, BatcherOptions, Strop

url, key, kind = sys.argv[1:4]
options = BatcherOptions(batch_size=1000, flush_interval=3600)
if kind == "sync":
    client = Strop(base_url=url, api_key=key, feedback_batching=options)
    for n in range(20):
        client.feedback.enqueue(client_id=f"exit-{n}", outcome="accepted")
else:
    async def main():
        client = AsyncStrop(base_url=url, api_key=key, feedback_batching=options)
        for n in range(20):
            client.feedback.enqueue(client_id=f"exit-{n}", outcome="accepted")
    asyncio.run(main())
print("exiting without close", flush=True)
"""


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_events_still_queued_at_interpreter_exit_are_sent(kind, api):
    with Strop(base_url=api.url, api_key=api.key) as client:
        log_interactions(client, 20, prefix="exit")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), api.url, api.key, kind],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    assert "exiting without close" in result.stdout
    assert Feedback.objects.filter(tenant=api.tenant, interaction__isnull=False).count() == 20


def _enqueue_together(client: Strop, start: threading.Barrier, client_id: str) -> None:
    start.wait()
    client.feedback.enqueue(client_id=client_id, outcome="accepted")


def test_concurrent_first_enqueues_share_one_batcher_and_flush_sees_every_event(api):
    """The batcher is made on the first ``enqueue``: threads that make it at the same moment must
    get the same one, else events sit in a batcher that ``flush``, ``stats`` and ``close`` never see."""
    threads_per_client, clients = 8, 12
    previous = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: the race shows at once
    try:
        for round_ in range(clients):
            options = BatcherOptions(flush_interval=NEVER)
            with Strop(base_url=api.url, api_key=api.key, feedback_batching=options) as client:
                start = threading.Barrier(threads_per_client)
                workers = [
                    threading.Thread(target=_enqueue_together, args=(client, start, f"race-{round_}-{n}"))
                    for n in range(threads_per_client)
                ]
                for worker in workers:
                    worker.start()
                for worker in workers:
                    worker.join()
                assert client.feedback.flush(timeout=60) is True
                assert client.feedback.batcher.stats.delivered == threads_per_client, f"round {round_}"
    finally:
        sys.setswitchinterval(previous)
    pending = Feedback.objects.filter(tenant=api.tenant, pending_client_id__startswith="race-")
    assert pending.count() == threads_per_client * clients


def test_an_enqueued_event_is_dated_when_it_was_enqueued_not_when_it_was_delivered(api):
    """The latest ``occurred_at`` wins: a partial accept queued before the user accepted the whole
    completion (sent at once) must not overwrite the accept when the batch leaves later."""
    options = BatcherOptions(flush_interval=NEVER)
    with Strop(base_url=api.url, api_key=api.key, feedback_batching=options) as client:
        interaction = client.interactions.log(client_id="d-1", prompt="x = ", completion="return a + b")
        client.feedback.enqueue(interaction_id=interaction.id, outcome="partial", accepted_chars=8)
        client.feedback.send(interaction_id=interaction.id, outcome="accepted")
        assert client.feedback.flush(timeout=60) is True
        feedback = client.interactions.get(interaction.id).feedback
    assert feedback is not None and (feedback.outcome, feedback.events_received) == ("accepted", 2)
