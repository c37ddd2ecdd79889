"""The SDK's persistence tracker against the real API: an accept is tracked, each checkpoint is read
and reported when the (injected) clock reaches it, and Strop stores what was kept at each."""

from __future__ import annotations

import logging
import threading
import time
import uuid

import httpx
import pytest
from strop import AsyncStrop, PersistenceTracker, Strop
from strop._persistence import MAX_BATCH_TEXT, MAX_TEXT, window

from apps.interactions.models import PersistenceReport
from apps.interactions.retention import retained_chars
from tests.sdk.conftest import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

COMPLETION = "return sorted(items)"
FUNCTION = "def total_price(items):\n    return sum(item.price * item.quantity for item in items)\n"
RENAMED = FUNCTION.replace("total_price", "order_total")  # the developer renamed it: its first line changed
INSERTED_AT = 40_500


def long_document(completion: str) -> str:
    """41,000 characters, ``completion`` at ``INSERTED_AT``: past the first 20,000 the API takes."""
    before = "".join(f"# line {i:05d} of code that came before\n" for i in range(1100))[:INSERTED_AT]
    return before + completion + "# tail\n" * 60


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


def test_an_insertion_offset_must_be_a_character_offset():
    tracker = PersistenceTracker(None, background=False)  # type: ignore[arg-type]
    for offset in (-1, 1.5, "40"):
        with pytest.raises(ValueError):
            tracker.track(client_id="t", read=lambda: COMPLETION, insertion_offset=offset)  # type: ignore[arg-type]
    assert tracker.tracked == 0


def test_tracking_after_close_raises_instead_of_dropping_the_accept():
    tracker = PersistenceTracker(None)  # type: ignore[arg-type]
    tracker.close()
    with pytest.raises(RuntimeError, match="closed"):
        tracker.track(client_id="t", read=lambda: COMPLETION)
    assert tracker.tracked == 0


def test_a_long_document_is_cut_around_the_insertion_offset_without_accepted_text(strop_client, api):
    strop_client.interactions.log(client_id="t-6", prompt="x", completion=FUNCTION)
    document = long_document(RENAMED)
    clock = FakeClock()
    tracker = PersistenceTracker(strop_client, clock=clock, checkpoints=(30,), background=False)
    tracker.track(client_id="t-6", read=lambda: document, insertion_offset=INSERTED_AT)
    clock.now += 30
    assert tracker.report_due() == 1
    assert kept(api) == {30: retained_chars(FUNCTION, document)} and kept(api)[30] > len(FUNCTION) // 2


def test_a_completion_whose_start_was_edited_is_found_by_a_piece_of_it(strop_client, api):
    strop_client.interactions.log(client_id="t-7", prompt="x", completion=FUNCTION)
    document = long_document(RENAMED)
    assert document.find(FUNCTION[:64]) == -1
    clock = FakeClock()
    tracker = PersistenceTracker(strop_client, clock=clock, checkpoints=(30,), background=False)
    tracker.track(client_id="t-7", read=lambda: document, accepted_text=FUNCTION)
    clock.now += 30
    assert tracker.report_due() == 1
    assert kept(api) == {30: retained_chars(FUNCTION, document)} and kept(api)[30] > len(FUNCTION) // 2


def test_the_window_takes_the_copy_of_the_completion_nearest_the_insertion_offset():
    # An older copy of the same code at the top; the one accepted, at the offset, was edited since.
    document = FUNCTION + long_document(RENAMED)[len(FUNCTION) :]
    sent = window(document, FUNCTION, insertion_offset=INSERTED_AT)
    assert len(sent) == MAX_TEXT and RENAMED in sent and FUNCTION not in sent


def test_a_reading_that_is_neither_text_nor_a_share_skips_only_that_checkpoint(strop_client, api, caplog):
    strop_client.interactions.log(client_id="t-8", prompt="x", completion=COMPLETION)
    strop_client.interactions.log(client_id="t-9", prompt="x", completion=COMPLETION)
    readings = iter([COMPLETION.encode(), float("nan"), COMPLETION])
    clock = FakeClock()
    tracker = PersistenceTracker(strop_client, clock=clock, background=False)
    tracker.track(client_id="t-8", read=lambda: next(readings))  # type: ignore[arg-type, return-value]
    tracker.track(client_id="t-9", read=lambda: COMPLETION)
    with caplog.at_level(logging.WARNING, logger="strop.persistence"):
        clock.now += 30
        assert tracker.report_due() == 1  # t-9's report still goes; bytes do not escape into the editor
        clock.now += 90
        assert tracker.report_due() == 1
        clock.now += 480
        assert tracker.report_due() == 2
    rows = PersistenceReport.objects.filter(tenant=api.tenant)
    assert sorted((r.interaction.client_id, r.checkpoint_s) for r in rows) == [
        ("t-8", 600),
        *(("t-9", c) for c in (30, 120, 600)),
    ]
    skipped = [r for r in caplog.records if "reading the text failed" in r.getMessage()]
    assert [r.exc_info[0] for r in skipped if r.exc_info] == [TypeError, ValueError]


def test_a_send_that_fails_with_any_error_is_logged_and_never_raised(strop_client, api, caplog):
    clock = FakeClock()
    tracker = PersistenceTracker(strop_client, clock=clock, checkpoints=(30,), background=False)
    tracker.track(client_id="t-10", read=lambda: COMPLETION)
    strop_client.close()  # the plugin closed its client first: httpx raises RuntimeError
    clock.now += 30
    with caplog.at_level(logging.WARNING, logger="strop.persistence"):
        assert tracker.report_due() == 0
    assert not kept(api)
    assert any(r.exc_info and r.exc_info[0] is RuntimeError for r in caplog.records)


def test_the_background_thread_outlives_a_send_that_raises(api):
    failures: list[str] = []

    def fail_the_first_report(request: httpx.Request) -> None:
        if request.url.path == "/v1/feedback/persistence" and not failures:
            failures.append(request.url.path)
            raise RuntimeError("Cannot send a request, as the client has been closed.")

    clock = FakeClock()
    with (
        httpx.Client(timeout=60, event_hooks={"request": [fail_the_first_report]}) as http,
        Strop(base_url=api.url, api_key=api.key, http_client=http) as client,
    ):
        client.interactions.log_batch(
            [{"client_id": c, "prompt": "x", "completion": COMPLETION} for c in ("t-11", "t-12")]
        )
        with PersistenceTracker(client, clock=clock, checkpoints=(5,)) as tracker:
            tracker.track(client_id="t-11", read=lambda: COMPLETION)
            clock.now += 5
            assert wait_until(lambda: bool(failures) and tracker.tracked == 0)
            tracker.track(client_id="t-12", read=lambda: COMPLETION)
            clock.now += 5
            assert wait_until(lambda: bool(kept(api)))
    rows = PersistenceReport.objects.filter(tenant=api.tenant)
    assert [(r.interaction.client_id, r.checkpoint_s) for r in rows] == [("t-12", 5)]


def test_the_background_thread_outlives_a_clock_that_raises(strop_client, api):
    strop_client.interactions.log(client_id="t-13", prompt="x", completion=COMPLETION)
    clock = FakeClock()
    in_thread = threading.Event()

    def flaky_clock() -> float:
        if threading.current_thread().name == "strop-persistence" and not in_thread.is_set():
            in_thread.set()
            raise OSError("clock unavailable")
        return clock()

    with PersistenceTracker(strop_client, clock=flaky_clock, checkpoints=(5,)) as tracker:
        tracker.track(client_id="t-13", read=lambda: COMPLETION)
        assert in_thread.wait(10)  # the thread asked the time of the next checkpoint, and failed
        clock.now += 5
        assert wait_until(lambda: bool(kept(api)))
    assert kept(api) == {5: len(COMPLETION)}


def test_more_reports_than_a_batch_takes_are_sent_in_several(api, traffic):
    clock = FakeClock()
    with Strop(base_url=api.url, api_key=api.key, http_client=traffic.client(timeout=60)) as client:
        tracker = PersistenceTracker(client, clock=clock, background=False)
        for n in range(350):  # 1,050 reports: over the 1,000 items one batch holds
            tracker.track(client_id=f"t-many-{n}", read=lambda: COMPLETION)
        clock.now += 600
        assert tracker.report_due() == 1050
    assert traffic.statuses("/v1/feedback/persistence") == [207, 207]
    assert PersistenceReport.objects.filter(tenant=api.tenant).count() == 1050


def test_more_text_than_a_batch_takes_is_sent_in_several(api, traffic):
    text = "x = 1\n" * (MAX_TEXT // 6)
    accepts = MAX_BATCH_TEXT // len(text) + 1
    clock = FakeClock()
    with Strop(base_url=api.url, api_key=api.key, http_client=traffic.client(timeout=60)) as client:
        tracker = PersistenceTracker(client, clock=clock, checkpoints=(30,), background=False)
        for n in range(accepts):
            tracker.track(client_id=f"t-long-{n}", read=lambda: text)
        clock.now += 30
        assert tracker.report_due() == accepts
    assert traffic.statuses("/v1/feedback/persistence") == [207, 207]
    assert PersistenceReport.objects.filter(tenant=api.tenant).count() == accepts


def test_reports_the_api_rejects_are_logged(strop_client, api, caplog):
    clock = FakeClock()
    tracker = PersistenceTracker(strop_client, clock=clock, checkpoints=(30,), background=False)
    tracker.track(interaction_id=str(uuid.uuid4()), read=lambda: COMPLETION)
    clock.now += 30
    with caplog.at_level(logging.WARNING, logger="strop.persistence"):
        tracker.report_due()
    assert any("1 persistence reports rejected" in r.getMessage() for r in caplog.records)
