"""The learning loop end to end: real Celery workers, Redis, Postgres, vLLM and the tiny model."""

from __future__ import annotations

import time

import pytest

from apps.adapters.models import AdapterVersion
from apps.adapters.services import adapter_create, base_model_register
from apps.engines.vllm import vllm_client
from apps.training.models import TrainingPolicy, TrainingRun, TrainingRunEvent
from apps.training.services import training_reap_stale, training_sweep_queued
from tests.fixtures.workers import wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True)]

TERMINAL = ("candidate", "rejected", "failed")


@pytest.fixture
def loop(served, celery_workers, make_tenant, make_client):
    """A tenant whose default adapter trains after 12 new labelled events, and workers running."""
    import uuid

    tenant = make_tenant(f"loop-{uuid.uuid4().hex[:6]}")
    base = base_model_register(name=served.served_model_name, path=served.model_dir)
    adapter = adapter_create(tenant, name="tab", base_model=base, is_default=True)
    TrainingPolicy.objects.create(
        tenant=tenant,
        adapter=adapter,
        min_new_events=12,
        heldout_fraction=0.25,
        trainer_overrides={"epochs": 1, "num_minibatches": 2},
    )
    client = make_client(tenant, scopes=["serve", "feedback", "admin"])
    return tenant, adapter, client, celery_workers


def serve_and_label(client, n: int, start: int = 0) -> list[str]:
    """Serve n completions to opted-in users through Strop and label them (accept every third)."""
    ids = []
    for i in range(start, start + n):
        response = client.post(
            "/v1/completions",
            {"prompt": f"def f{i}(x):\n    ", "max_tokens": 6, "user": f"dev-{i % 4}", "opted_in": True, "seed": i},
            format="json",
        )
        assert response.status_code == 200, response.content
        ids.append(response.json()["id"])
    for k, interaction_id in enumerate(ids):
        outcome = "accepted" if k % 3 == 0 else "rejected"
        response = client.post("/v1/feedback", {"interaction_id": interaction_id, "outcome": outcome}, format="json")
        assert response.status_code == 200
    return ids


def finished_run(adapter, workers, *, exclude=(), timeout=240) -> TrainingRun:
    def done():
        return TrainingRun.objects.filter(adapter=adapter, status__in=TERMINAL).exclude(pk__in=exclude).first()

    run = wait_until(done, timeout=timeout, what="a finished training run", workers=workers)
    assert isinstance(run, TrainingRun)
    return run


def test_feedback_trains_a_candidate_that_passes_the_gate_and_answers_in_vllm(loop):
    tenant, adapter, client, workers = loop
    serve_and_label(client, 12)
    run = finished_run(adapter, workers)
    assert run.status == "candidate", (run.error, run.gate)
    assert run.window_size + run.heldout_size == 12
    assert run.gate["passed"] is True and set(run.stage_seconds) >= {"export", "train", "gate", "load"}
    version = run.output_version
    assert version.loaded_at is not None and version.parent is None
    assert version.vllm_name in {m.id for m in vllm_client().models()}

    assert client.post(f"/v1/adapters/tab/versions/{version.number}/promote").status_code == 200
    response = client.post("/v1/completions", {"prompt": "def g(x):\n    ", "max_tokens": 6}, format="json")
    assert response.status_code == 200 and response.json()["strop"]["version"] == version.vllm_name


def test_events_that_arrive_during_training_are_in_the_next_runs_window(loop):
    tenant, adapter, client, workers = loop
    # What this test is about is the windows: a gate that weighs a handful of held-out events on the
    # tiny model may reject either run by chance, so its reward margin is out of the way here.
    TrainingPolicy.objects.filter(adapter=adapter).update(
        trainer_overrides={"epochs": 4, "target_kl": None}, gate_overrides={"reward_margin": 10.0}
    )
    serve_and_label(client, 12)
    wait_until(
        lambda: TrainingRun.objects.filter(adapter=adapter, status="training").exists(),
        timeout=120,
        what="run 1 to train",
        workers=workers,
    )
    late = serve_and_label(client, 12, start=100)  # while run 1 trains
    first = finished_run(adapter, workers)
    assert first.status == "candidate", (first.error, first.gate)
    second = finished_run(adapter, workers, exclude=[first.pk])
    assert second.status == "candidate", (second.error, second.gate)
    assert second.parent_version_id == first.output_version_id

    def window(run, held_out):
        return set(
            TrainingRunEvent.objects.filter(run=run, held_out=held_out).values_list(
                "feedback__interaction_id", flat=True
            )
        )

    trained1, trained2 = window(first, False), window(second, False)
    assert {str(i) for i in window(second, False) | window(second, True)} >= set(late)
    assert not trained1 & trained2  # no event learned twice in one lineage


def test_a_run_whose_trainer_raises_fails_with_the_error_and_leaves_the_adapter(loop):
    tenant, adapter, client, workers = loop
    TrainingPolicy.objects.filter(adapter=adapter).update(trainer_overrides={"no_such_option": 1})
    serve_and_label(client, 12)
    run = finished_run(adapter, workers)
    assert run.status == "failed" and "no_such_option" in run.error
    assert not AdapterVersion.objects.filter(adapter=adapter).exists()
    adapter.refresh_from_db()
    assert adapter.production_version is None


def test_a_worker_killed_mid_run_leaves_a_run_that_is_requeued_and_completed(loop):
    tenant, adapter, client, workers = loop
    # The longest run a tenant may ask for (tenants' overrides are bounded), on three times the events.
    TrainingPolicy.objects.filter(adapter=adapter).update(
        trainer_overrides={"epochs": 4, "num_minibatches": 16, "target_kl": None}
    )
    serve_and_label(client, 36)
    wait_until(
        lambda: TrainingRun.objects.filter(adapter=adapter, status="training").exists(),
        timeout=120,
        what="the run to train",
        workers=workers,
    )
    workers.kill("gpu")
    run = TrainingRun.objects.get(adapter=adapter)
    assert run.status == "training"
    time.sleep(3)
    assert training_reap_stale(stale_after_s=2) == [run.pk]
    TrainingPolicy.objects.filter(adapter=adapter).update(trainer_overrides={"epochs": 1})
    workers.start_gpu()
    killed = run.pk
    run = wait_until(
        lambda: TrainingRun.objects.filter(pk=killed, status__in=TERMINAL).first(),
        timeout=240,
        what="the requeued run to finish",
        workers=workers,
    )
    assert (run.status, run.attempt) == ("candidate", 2), (run.error, run.gate)
    # The killed attempt registered nothing: every version is a run's output (labels that arrived
    # while the run trained may have started and finished a second run by now, with a version of its own).
    outputs = TrainingRun.objects.filter(adapter=adapter).values("output_version")
    assert not AdapterVersion.objects.filter(adapter=adapter).exclude(pk__in=outputs).exists()


def test_a_run_whose_message_the_broker_lost_is_sent_again_and_completes(loop):
    """Redis here keeps nothing on disk: a restart loses queued messages, as this purge does."""
    from config.celery import app

    tenant, adapter, client, workers = loop
    workers.kill("gpu")  # nobody takes gpu work while the message sits in Redis
    serve_and_label(client, 12)
    run = wait_until(
        lambda: TrainingRun.objects.filter(adapter=adapter).first(),
        timeout=60,
        what="the run to be scheduled",
        workers=workers,
    )
    time.sleep(1)
    app.control.purge()
    workers.start_gpu()
    time.sleep(3)
    run.refresh_from_db()
    assert run.status == "queued"  # the record survived in Postgres; the message did not
    assert run.pk in training_sweep_queued(older_than_s=0)
    run = finished_run(adapter, workers)
    assert run.status == "candidate", (run.error, run.gate)
