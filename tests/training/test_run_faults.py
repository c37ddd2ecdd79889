"""A run's faults: a heartbeat that fails once beats again, one that cannot beat stops the run as
lost, a run that ends failed or rejected commits with its webhook delivery or not at all, and a run
that registered its version is never reported as having registered nothing: not when vLLM fails to
load it, not when the reaper reads it just before."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import OperationalError
from django.utils import timezone

import apps.training.pipeline as pipeline
import apps.training.services.runs as runs
from apps.adapters.models import AdapterVersion
from apps.adapters.services import adapter_version_register
from apps.notifications.models import WebhookDelivery
from apps.notifications.services import webhook_create
from apps.training.models import TrainingRun
from apps.training.services import training_reap_stale, training_run_advance, training_run_claim, training_schedule
from tests.serving.scripted_vllm import vllm_error


def claimed_run(adapter) -> TrainingRun:
    run = TrainingRun.objects.create(tenant=adapter.tenant, adapter=adapter)
    claimed = training_run_claim(run.pk, attempt=1)
    assert claimed is not None
    return claimed


def wait_for(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def heartbeat_failing(monkeypatch, *, times: int) -> list[int]:
    """Make the heartbeat's update raise as a lost connection would, ``times`` times (then beat); the
    calls are counted in the list returned."""
    real, calls = pipeline.training_run_heartbeat, []

    def beat(run_id: int, *, attempt: int) -> bool:
        calls.append(run_id)
        if len(calls) <= times:
            raise OperationalError("server closed the connection unexpectedly")
        return real(run_id, attempt=attempt)

    monkeypatch.setattr(pipeline, "training_run_heartbeat", beat)
    return calls


@pytest.mark.django_db(transaction=True)  # the heartbeat writes from a connection of its own
def test_a_heartbeat_that_fails_once_beats_again_and_the_run_is_not_lost(tiny_adapter, settings, monkeypatch):
    settings.TRAINING_HEARTBEAT_S = 0.05
    run = claimed_run(tiny_adapter)
    before = run.heartbeat_at
    calls = heartbeat_failing(monkeypatch, times=1)
    heartbeat = pipeline._Heartbeat(run)
    heartbeat.start()
    try:
        assert wait_for(lambda: len(calls) >= 3 or not heartbeat.is_alive())
        assert heartbeat.is_alive() and not heartbeat.lost.is_set()
    finally:
        heartbeat.stop()
    run.refresh_from_db()
    assert run.heartbeat_at > before  # the beats after the failure went through


@pytest.mark.django_db(transaction=True)
def test_a_heartbeat_that_cannot_beat_for_the_stale_time_stops_the_run_as_lost(tiny_adapter, settings, monkeypatch):
    settings.TRAINING_HEARTBEAT_S = 0.05
    settings.TRAINING_STALE_AFTER_S = 0.3
    run = claimed_run(tiny_adapter)
    heartbeat_failing(monkeypatch, times=10**6)
    heartbeat = pipeline._Heartbeat(run)
    heartbeat.start()
    try:
        assert wait_for(heartbeat.lost.is_set)
        with pytest.raises(pipeline.RunTakenBack):
            pipeline._Guard(run, heartbeat).check()  # the run stops at its next step
    finally:
        heartbeat.stop()
    assert not heartbeat.is_alive()


def notification_failing(monkeypatch) -> None:
    """The delivery's write fails (the connection lost between the run's change and it)."""

    def send(*args, **kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(runs, "notification_send", send)


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["failed", "rejected"])
def test_a_run_that_ends_commits_with_its_webhook_delivery(tiny_adapter, settings, status):
    settings.STROP_WEBHOOK_ALLOW_PRIVATE = True
    webhook_create(
        tiny_adapter.tenant, url="http://127.0.0.1:9/hook", events=["run.failed", "run.rejected"], actor="test"
    )
    run = claimed_run(tiny_adapter)
    assert training_run_advance(run, status=status, error="boom" if status == "failed" else "")
    (delivery,) = WebhookDelivery.objects.filter(tenant=tiny_adapter.tenant)
    assert delivery.event == f"run.{status}" and delivery.payload["data"]["run"] == run.pk
    assert TrainingRun.objects.get(pk=run.pk).status == status


@pytest.mark.django_db
@pytest.mark.parametrize("status", ["failed", "rejected"])
def test_a_run_whose_webhook_delivery_cannot_be_written_does_not_end_without_it(tiny_adapter, monkeypatch, status):
    run = claimed_run(tiny_adapter)
    notification_failing(monkeypatch)
    with pytest.raises(OperationalError):
        training_run_advance(run, status=status, error="boom")
    stored = TrainingRun.objects.get(pk=run.pk)
    assert (stored.status, stored.error, stored.finished_at) == ("exporting", "", None)
    assert run.status == "exporting"  # the instance still reads what is stored: the worker may record it again


@pytest.mark.django_db
def test_the_reaper_does_not_end_a_run_past_its_wall_time_without_its_webhook_delivery(
    tiny_adapter, settings, monkeypatch
):
    run = claimed_run(tiny_adapter)
    long_ago = timezone.now() - timedelta(seconds=settings.TRAINING_MAX_RUN_S + 3600)
    TrainingRun.objects.filter(pk=run.pk).update(status="training", started_at=long_ago, heartbeat_at=timezone.now())
    notification_failing(monkeypatch)
    with pytest.raises(OperationalError):
        training_reap_stale(stale_after_s=60)
    assert TrainingRun.objects.get(pk=run.pk).status == "training"


@pytest.mark.django_db
def test_the_reaper_does_not_give_up_on_a_run_without_its_webhook_delivery(tiny_adapter, settings, monkeypatch):
    settings.TRAINING_MAX_ATTEMPTS = 1
    run = claimed_run(tiny_adapter)
    TrainingRun.objects.filter(pk=run.pk).update(status="training", heartbeat_at=timezone.now() - timedelta(hours=1))
    notification_failing(monkeypatch)
    with pytest.raises(OperationalError):
        training_reap_stale(stale_after_s=60)
    assert TrainingRun.objects.get(pk=run.pk).status == "training"


def _name_taken(upstream):
    """vLLM already has the version's name, loaded from another path: an AdapterConflict."""

    def answer(path: str, body: dict) -> tuple[int, object]:
        upstream.models.append(body["lora_name"])  # listed with another root than the path asked
        return vllm_error(400, f"The lora adapter '{body['lora_name']}' has already been loaded.", "BadRequestError")

    return answer


def _accepted_but_not_listed(upstream):
    """vLLM answers the load 200 and then does not list the adapter."""
    return lambda path, body: (200, "Success: LoRA adapter loaded")


@pytest.mark.django_db(transaction=True)  # the run's heartbeat reads it from a connection of its own
@pytest.mark.parametrize("answer", [_name_taken, _accepted_but_not_listed])
def test_a_load_that_fails_after_registering_leaves_the_run_a_candidate_with_its_version(
    tiny_adapter, policy, add_events, execute_run, scripted_vllm, settings, answer
):
    """The version is registered and the lineage's head before vLLM is asked: a load that fails then
    (not for vLLM being down) must not end the run failed beside it. It ends a candidate, the load
    left to the serving queue and to first use, and the run's log says what vLLM answered."""
    settings.STROP_WEBHOOK_ALLOW_PRIVATE = True
    webhook_create(tiny_adapter.tenant, url="http://127.0.0.1:9/hook", events=["run.failed"], actor="test")
    scripted_vllm.script = answer(scripted_vllm)
    add_events(16)
    run = training_schedule(tiny_adapter, force=True)

    assert execute_run(run) == "candidate"

    run.refresh_from_db()
    assert (run.status, run.error) == ("candidate", ""), run.error
    version = run.output_version
    assert version is not None and version.status == AdapterVersion.Status.CANDIDATE
    assert version.loaded_at is None  # not loaded, and not marked failed: a load can still succeed
    assert [path for path, _ in scripted_vllm.asked] == ["/v1/load_lora_adapter"]
    assert f"loading version {version.number} in vLLM failed" in run.log
    assert not WebhookDelivery.objects.filter(event="run.failed").exists()


@pytest.mark.django_db
def test_the_reaper_does_not_say_nothing_was_registered_of_a_run_that_registers_while_it_reads(
    tiny_adapter, settings, monkeypatch, make_lora_adapter
):
    """The reaper reads a run past its wall time without a version; the run registers one (its
    status unchanged) before the reaper's update. That update must not end the run "nothing was
    registered" beside a version that stands: the next pass ends it naming the version."""
    run = claimed_run(tiny_adapter)
    long_ago = timezone.now() - timedelta(seconds=settings.TRAINING_MAX_RUN_S + 3600)
    TrainingRun.objects.filter(pk=run.pk).update(status="evaluating", started_at=long_ago, heartbeat_at=timezone.now())
    run.refresh_from_db()
    real_reason = runs.wall_time_reason

    def registering_meanwhile(kept=None):
        version = adapter_version_register(
            tiny_adapter.tenant, adapter=tiny_adapter, source_dir=make_lora_adapter(1), enqueue_load=False
        )
        assert training_run_advance(run, status=run.status, output_version=version)  # as the pipeline registers
        return real_reason(kept)

    monkeypatch.setattr(runs, "wall_time_reason", registering_meanwhile)
    training_reap_stale(stale_after_s=60)
    stored = TrainingRun.objects.get(pk=run.pk)
    assert stored.output_version is not None
    assert (stored.status, stored.error) == ("evaluating", ""), stored.error

    monkeypatch.setattr(runs, "wall_time_reason", real_reason)
    training_reap_stale(stale_after_s=60)
    stored.refresh_from_db()
    assert stored.status == "failed"
    assert stored.error.endswith(f"version {stored.output_version.number} it had registered stands"), stored.error
