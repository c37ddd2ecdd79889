from __future__ import annotations

import threading
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.db import connection
from django.utils import timezone

from apps.training.models import TrainingPolicy, TrainingRun
from apps.training.services import (
    training_reap_stale,
    training_run_advance,
    training_run_claim,
    training_schedule,
    training_sweep_queued,
)


@pytest.mark.django_db
def test_a_run_starts_only_with_enough_new_events(tiny_adapter, add_events):
    add_events(7)
    assert training_schedule(tiny_adapter) is None
    add_events(1)
    run = training_schedule(tiny_adapter)
    assert run is not None and run.status == "queued" and run.trigger == "8 new events"


@pytest.mark.django_db
def test_a_run_starts_with_fewer_events_once_the_oldest_waited_long_enough(tiny_adapter, add_events):
    add_events(2)
    assert training_schedule(tiny_adapter) is None
    TrainingPolicy.objects.filter(adapter=tiny_adapter).update(max_wait_s=0)
    assert training_schedule(tiny_adapter) is not None


@pytest.mark.django_db
def test_a_disabled_policy_schedules_nothing(tiny_adapter, add_events):
    TrainingPolicy.objects.filter(adapter=tiny_adapter).update(enabled=False)
    add_events(20)
    assert training_schedule(tiny_adapter) is None


@pytest.mark.django_db
def test_the_tenant_cap_limits_concurrent_runs(tenant, tiny_adapter, add_events):
    from apps.adapters.services import adapter_create

    second = adapter_create(tenant, name="second", base_model=tiny_adapter.base_model)
    TrainingPolicy.objects.create(tenant=tenant, adapter=second, min_new_events=1)
    add_events(8)
    assert training_schedule(tiny_adapter) is not None
    assert training_schedule(second, force=True) is None  # cap 1: the tenant already has a run going


@pytest.mark.django_db(transaction=True)
def test_two_schedulers_racing_create_one_run(tiny_adapter, add_events):
    add_events(8)
    barrier = threading.Barrier(4)
    results: list[object] = []

    def schedule() -> None:
        try:
            barrier.wait()
            results.append(training_schedule(tiny_adapter))
        finally:
            connection.close()

    threads = [threading.Thread(target=schedule) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert TrainingRun.objects.filter(adapter=tiny_adapter).count() == 1
    assert sum(r is not None for r in results) == 1


@pytest.mark.django_db
def test_a_run_is_claimed_once_per_attempt(tiny_adapter):
    run = TrainingRun.objects.create(tenant=tiny_adapter.tenant, adapter=tiny_adapter)
    assert training_run_claim(run.pk, attempt=1) is not None
    assert training_run_claim(run.pk, attempt=1) is None  # the same message delivered twice
    assert training_run_claim(run.pk, attempt=2) is None


@pytest.mark.django_db
def test_the_reaper_requeues_a_silent_run_and_the_old_attempt_cannot_finish_it(tiny_adapter):
    run = TrainingRun.objects.create(tenant=tiny_adapter.tenant, adapter=tiny_adapter)
    claimed = training_run_claim(run.pk, attempt=1)
    TrainingRun.objects.filter(pk=run.pk).update(status="training", heartbeat_at=timezone.now() - timedelta(minutes=5))
    claimed.status = "training"
    assert training_reap_stale(stale_after_s=60) == [run.pk]
    run.refresh_from_db()
    assert (run.status, run.attempt) == ("queued", 2)
    assert not training_run_advance(claimed, status="candidate")  # the zombie's late result is ignored
    assert training_run_claim(run.pk, attempt=2) is not None


@pytest.mark.django_db
def test_a_run_that_keeps_dying_ends_failed(settings, tiny_adapter):
    settings.TRAINING_MAX_ATTEMPTS = 2
    run = TrainingRun.objects.create(
        tenant=tiny_adapter.tenant,
        adapter=tiny_adapter,
        attempt=2,
        status="training",
        heartbeat_at=timezone.now() - timedelta(minutes=5),
    )
    training_reap_stale(stale_after_s=60)
    run.refresh_from_db()
    assert run.status == "failed" and "2 times" in run.error


@pytest.mark.django_db
def test_the_sweeper_resends_runs_the_broker_may_have_lost(tiny_adapter):
    old = TrainingRun.objects.create(tenant=tiny_adapter.tenant, adapter=tiny_adapter)
    TrainingRun.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(minutes=5))
    assert training_sweep_queued(older_than_s=60) == [old.pk]


@pytest.mark.django_db(transaction=True)
def test_a_burst_of_single_feedback_requests_schedules_a_run_without_beat(tiny_adapter, make_client, celery_workers):
    """The check runs after the burst (trailing edge), so the last event is always counted: a
    check started by the first event alone would see too few and leave the rest to beat."""
    from tests.fixtures.workers import wait_until

    TrainingPolicy.objects.filter(adapter=tiny_adapter).update(min_new_events=12, max_wait_s=10**6)
    client = make_client(tiny_adapter.tenant, scopes=["ingest", "feedback"])
    items = [
        {
            "client_id": f"burst-{i}",
            "prompt": f"x{i} = ",
            "completion": "1",
            "end_user_id": f"dev-{i % 3}",
            "opted_in": True,
        }
        for i in range(12)
    ]
    assert client.post("/v1/interactions", {"items": items}, format="json").status_code == 207
    for i in range(12):
        response = client.post("/v1/feedback", {"client_id": f"burst-{i}", "outcome": "accepted"}, format="json")
        assert response.status_code == 200
    run = wait_until(
        lambda: TrainingRun.objects.filter(adapter=tiny_adapter).first(),
        timeout=120,
        what="the run the 12th feedback event makes due",
        workers=celery_workers,
    )
    assert run.trigger == "12 new events"


@pytest.mark.django_db
def test_a_scheduling_check_clears_the_debounce_so_later_events_ask_again(tiny_adapter):
    from django.core.cache import cache

    from apps.common.debounce import debounce_key
    from apps.interactions.training_check import SCHEDULE_TASK
    from workers.training import training_schedule_tenant

    key = debounce_key(SCHEDULE_TASK, tiny_adapter.tenant_id)
    cache.set(key, 1, timeout=60)
    training_schedule_tenant(tiny_adapter.tenant_id)  # the task, run here as the worker runs it
    assert cache.get(key) is None


@pytest.mark.django_db
def test_while_its_own_check_cannot_have_started_a_process_does_not_ask_redis_again(tiny_adapter, monkeypatch):
    """Events that commit before the check this process asked for starts are counted by it, so the
    process skips the debounce's Redis round trip for them; from the moment that check may start
    (its delay less the margin for a worker clock running ahead), it asks again. Seen from Redis:
    the key the check clears is not set again by a skipped ask."""
    from django.core.cache import cache

    from apps.common import debounce as services
    from apps.interactions.training_check import SCHEDULE_TASK, training_check_soon

    clock = [1_000_000.0]
    monkeypatch.setattr(services, "time", SimpleNamespace(time=lambda: clock[0]))
    monkeypatch.setitem(services._asked_until, (SCHEDULE_TASK, tiny_adapter.tenant_id), 0.0)
    key = services.debounce_key(SCHEDULE_TASK, tiny_adapter.tenant_id)
    window = services.DEBOUNCE_DELAY_S * services.DEBOUNCE_TRUSTED_FRACTION
    assert 0 < window <= services.DEBOUNCE_DELAY_S - 0.1
    training_check_soon(tiny_adapter.tenant_id)
    assert cache.get(key) == int((1_000_000.0 + services.DEBOUNCE_DELAY_S) * 1000)  # when it is due
    cache.delete(key)  # as the check does when it starts, which it cannot have done yet
    clock[0] += window - 0.001
    training_check_soon(tiny_adapter.tenant_id)
    assert cache.get(key) is None  # skipped: no round trip to Redis
    clock[0] += 0.001  # from here the check may have started
    training_check_soon(tiny_adapter.tenant_id)
    assert cache.get(key) is not None
    cache.delete(key)


@pytest.mark.django_db
def test_a_process_that_finds_another_processs_check_pending_trusts_it_until_it_is_due(tiny_adapter, monkeypatch):
    """Another API process asked for a check due at T (its key holds T): this process's event is
    counted by it, and so are its next ones until T less the margin, so it does not ask Redis for
    them; from then on it asks again. A key left by a check whose message was lost (due in the
    past) earns no trust, and one from a clock far ahead no more than this process's own ask."""
    from django.core.cache import cache

    from apps.common import debounce as services
    from apps.interactions.training_check import SCHEDULE_TASK, training_check_soon

    clock = [2_000_000.0]
    monkeypatch.setattr(services, "time", SimpleNamespace(time=lambda: clock[0]))
    monkeypatch.setitem(services._asked_until, (SCHEDULE_TASK, tiny_adapter.tenant_id), 0.0)
    key = services.debounce_key(SCHEDULE_TASK, tiny_adapter.tenant_id)
    due = clock[0] + 0.3  # asked 0.2 s ago by another process
    cache.set(key, int(due * 1000), timeout=60)
    training_check_soon(tiny_adapter.tenant_id)
    assert cache.get(key) == int(due * 1000)  # found pending: not replaced, nothing enqueued
    cache.delete(key)
    clock[0] = due - 0.1 - 0.001
    training_check_soon(tiny_adapter.tenant_id)
    assert cache.get(key) is None  # skipped: the pending check will count it
    clock[0] = due - 0.1  # from here that check may have started
    cache.set(key, int((clock[0] - 5) * 1000), timeout=60)  # a key whose check never came
    training_check_soon(tiny_adapter.tenant_id)
    training_check_soon(tiny_adapter.tenant_id)
    assert services._asked_until[(SCHEDULE_TASK, tiny_adapter.tenant_id)] < clock[0]  # every event asks again
    cache.set(key, int((clock[0] + 3600) * 1000), timeout=60)  # set by a process whose clock runs an hour ahead
    training_check_soon(tiny_adapter.tenant_id)
    assert services._asked_until[(SCHEDULE_TASK, tiny_adapter.tenant_id)] <= clock[0] + services.DEBOUNCE_DELAY_S
    cache.delete(key)


@pytest.mark.django_db
def test_the_sweeper_resends_a_run_only_when_the_gpu_queue_lost_its_message(tiny_adapter):
    """A run may wait long behind other tenants' runs; it is sent again only once the broker's gpu
    queue holds fewer messages than runs sent and waiting (Redis restarted), not every minute."""
    from apps.common.tasks import enqueue
    from apps.training.services import training_schedule
    from config.celery import app

    app.control.purge()  # messages other tests left in the suite's broker
    run = training_schedule(tiny_adapter, force=True)  # sent on commit, which this test never reaches
    assert run is not None and run.status == "queued"
    assert training_sweep_queued(older_than_s=60) == []  # sent a moment ago
    TrainingRun.objects.filter(pk=run.pk).update(dispatched_at=timezone.now() - timedelta(minutes=5))
    assert enqueue("workers.training.training_run_execute", run.pk, run.attempt)  # its message is in the queue
    try:
        assert training_sweep_queued(older_than_s=60) == []  # waiting, not lost
        app.control.purge()  # the broker loses it
        assert training_sweep_queued(older_than_s=60) == [run.pk]
    finally:
        app.control.purge()


@pytest.mark.django_db
def test_the_reaper_leaves_a_run_that_registered_its_version_to_stand_instead_of_requeuing_it(
    tiny_adapter, make_lora_adapter, add_events
):
    from apps.adapters.services import adapter_version_register
    from apps.interactions.models import Feedback
    from apps.training.models import TrainingRunEvent

    version = adapter_version_register(
        tiny_adapter.tenant, adapter=tiny_adapter, source_dir=make_lora_adapter(3), enqueue_load=False
    )
    run = TrainingRun.objects.create(
        tenant=tiny_adapter.tenant,
        adapter=tiny_adapter,
        status="evaluating",
        output_version=version,
        started_at=timezone.now(),
        heartbeat_at=timezone.now() - timedelta(minutes=5),
    )
    add_events(4)
    for feedback in Feedback.objects.filter(tenant=tiny_adapter.tenant):
        TrainingRunEvent.objects.create(run=run, feedback=feedback, held_out=False, reward=0.75)
    assert training_reap_stale(stale_after_s=60) == []
    run.refresh_from_db()
    assert (run.status, run.attempt, run.output_version) == ("candidate", 1, version)
    assert TrainingRunEvent.objects.filter(run=run).count() == 4  # the record of what the version learned stays
