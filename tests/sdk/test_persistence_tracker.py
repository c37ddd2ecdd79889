"""The SDK's persistence tracker against the real API: an accept is tracked, each checkpoint is read
and reported when the (injected) clock reaches it, and Strop stores what was kept at each."""

from __future__ import annotations

import time

import pytest
from strop import AsyncStrop, PersistenceTracker

from apps.interactions.models import PersistenceReport

pytestmark = pytest.mark.django_db(transaction=True)

COMPLETION = "return sorted(items)"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def kept(api) -> dict[int, int]:
    return dict(PersistenceReport.objects.filter(tenant=api.tenant).values_list("checkpoint_s", "retained_chars"))


def test_the_tracker_reports_at_30_s_2_min_and_10_min_what_is_left(strop_client, api):
    interaction = strop_client.interactions.log(client_id="t-1", prompt="def f(items):\n    ", completion=COMPLETION)
    document = {"text": "def f(items):\n    " + COMPLETION + "\n"}
    clock = FakeClock()
    tracker = PersistenceTracker(strop_client, clock=clock, background=False)
    tracker.track(interaction_id=interaction.id, read=lambda: document["text"], accepted_text=COMPLETION)
    assert tracker.report_due() == 0  # nothing is due at the accept
    clock.now += 30
    assert tracker.report_due() == 1
    document["text"] = "def f(items):\n    return items\n"  # the developer rewrote it
    clock.now += 90
    assert tracker.report_due() == 1
    document["text"] = "def f(items):\n    pass\n"
    clock.now += 480
    assert tracker.report_due() == 1 and tracker.tracked == 0
    reports = kept(api)
    assert reports[30] == len(COMPLETION) and reports[600] < reports[120] < reports[30]
    # The same figures read back through the API, with the typed result.
    read = strop_client.interactions.persistence(interaction.id)
    assert read.interaction_id == interaction.id and read.latest_checkpoint_s == 600
    assert read.retained_chars == reports[600] and read.accepted_chars == len(COMPLETION)
    assert [(r.checkpoint_s, r.retained_chars) for r in read.reports] == sorted(reports.items())
    assert read.reports[0].retained_share == 1.0 and read.reports[0].occurred_at is not None


def test_a_late_tracker_sends_every_checkpoint_due_in_one_batch_even_before_the_interaction(strop_client, api):
    clock = FakeClock()
    tracker = PersistenceTracker(strop_client, clock=clock, background=False)
    tracker.track(client_id="t-late", read=lambda: COMPLETION)
    tracker.track(client_id="t-late-2", read=lambda: 0.25, accepted_chars=4)  # a ratio the plugin measured
    clock.now += 3600
    assert tracker.report_due() == 6
    assert PersistenceReport.objects.filter(tenant=api.tenant, pending_client_id__isnull=False).count() == 6
    strop_client.interactions.log_batch(
        [
            {"client_id": "t-late", "prompt": "x", "completion": COMPLETION},
            {"client_id": "t-late-2", "prompt": "x", "completion": "abcdefgh"},
        ]
    )
    rows = PersistenceReport.objects.filter(tenant=api.tenant)
    assert {(r.interaction.client_id, r.checkpoint_s, r.accepted_chars, r.retained_chars) for r in rows} == {
        *(("t-late", c, len(COMPLETION), len(COMPLETION)) for c in (30, 120, 600)),
        *(("t-late-2", c, 4, 1) for c in (30, 120, 600)),
    }


def test_a_reader_that_fails_or_finds_the_document_gone_skips_only_that_checkpoint(strop_client, api):
    strop_client.interactions.log(client_id="t-2", prompt="x", completion=COMPLETION)
    readings = iter([RuntimeError("buffer closed"), None, COMPLETION])

    def read() -> str | None:
        value = next(readings)
        if isinstance(value, Exception):
            raise value
        return value

    clock = FakeClock()
    tracker = PersistenceTracker(strop_client, clock=clock, background=False)
    tracker.track(client_id="t-2", read=read)
    for step in (30, 90, 480):
        clock.now += step
        tracker.report_due()
    assert kept(api) == {600: len(COMPLETION)}


def test_the_background_thread_reports_without_the_callers_help(strop_client, api):
    strop_client.interactions.log(client_id="t-3", prompt="x", completion=COMPLETION)
    clock = FakeClock()
    with PersistenceTracker(strop_client, clock=clock, checkpoints=(5,)) as tracker:
        tracker.track(client_id="t-3", read=lambda: COMPLETION)
        clock.now += 5
        deadline = time.monotonic() + 60
        while not kept(api) and time.monotonic() < deadline:
            time.sleep(0.1)
    assert kept(api) == {5: len(COMPLETION)}


def test_a_document_too_long_to_send_is_cut_around_the_completion(strop_client, api):
    strop_client.interactions.log(client_id="t-4", prompt="x", completion=COMPLETION)
    document = "# filler\n" * 20_000 + COMPLETION + "\n" + "# more\n" * 5_000
    clock = FakeClock()
    tracker = PersistenceTracker(strop_client, clock=clock, checkpoints=(30,), background=False)
    tracker.track(client_id="t-4", read=lambda: document, accepted_text=COMPLETION)
    clock.now += 30
    assert tracker.report_due() == 1
    assert kept(api) == {30: len(COMPLETION)}


def test_both_clients_send_one_report_and_read_what_was_measured(strop_client, api):
    import asyncio

    strop_client.interactions.log(client_id="t-5", prompt="x", completion=COMPLETION)
    sync = strop_client.feedback.persistence(client_id="t-5", checkpoint_s=30, text=COMPLETION + "  # kept")

    async def main():
        async with AsyncStrop(base_url=api.url, api_key=api.key, timeout=60) as client:
            return await client.feedback.persistence(client_id="t-5", checkpoint_s=120, text="")

    later = asyncio.run(main())

    async def read_back():
        async with AsyncStrop(base_url=api.url, api_key=api.key, timeout=60) as client:
            interaction = (await client.interactions.list()).results[0]
            return await client.interactions.persistence(interaction.id)

    back = asyncio.run(read_back())
    assert [(r.checkpoint_s, r.retained_chars) for r in back.reports] == [(30, len(COMPLETION)), (120, 0)]
    assert (sync.status, sync.accepted_chars, sync.retained_chars) == ("recorded", len(COMPLETION), len(COMPLETION))
    assert (later.checkpoint_s, later.retained_chars) == (120, 0)


def test_checkpoints_must_be_whole_seconds():
    with pytest.raises(ValueError):
        PersistenceTracker(None, checkpoints=(0, 30), background=False)  # type: ignore[arg-type]
