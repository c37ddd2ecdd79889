"""Training is bounded and fair: what a tenant may override, the wall-time limit, the gpu queue's
order between tenants, and what an erase does to runs and versions that learned from the user."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.adapters.models import AdapterVersion
from apps.adapters.services import adapter_create, adapter_version_register
from apps.interactions.models import Interaction
from apps.privacy.services import end_user_erase
from apps.training.erasure import erased_user_hash
from apps.training.models import TrainingPolicy, TrainingRun, TrainingRunErasure, TrainingRunEvent
from apps.training.services import RERUN_TRIGGER, training_reap_stale, training_run_claim, training_schedule
from tests.fixtures.locks import held_in_a_thread, wait_for_a_waiting_lock
from tests.fixtures.workers import wait_until

TERMINAL = ("candidate", "rejected", "failed")


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"trainer_overrides": {"epochs": 1_000_000_000}}, "trainer_overrides.epochs: must be an integer from 1 to 4"),
        ({"trainer_overrides": {"lora_rank": 4096}}, "trainer_overrides.lora_rank: must be an integer from 1 to 16"),
        ({"trainer_overrides": {"max_lora_rank": 4096}}, "trainer_overrides.max_lora_rank: not a setting"),
        ({"trainer_overrides": {"device": "cuda:9"}}, "trainer_overrides.device: not a setting"),
        ({"trainer_overrides": {"max_tokens_per_pass": 10**12}}, "trainer_overrides.max_tokens_per_pass: not a"),
        ({"trainer_overrides": {"dtype": "bfloat16"}}, "trainer_overrides.dtype: not a setting"),
        ({"trainer_overrides": {"learning_rate": 1.0}}, "trainer_overrides.learning_rate: must be a number from"),
        ({"trainer_overrides": {"baseline": "best"}}, "trainer_overrides.baseline: must be 'batch_mean' or 'none'"),
        ({"trainer_overrides": {"epochs": 2.5}}, "trainer_overrides.epochs: must be an integer"),
        ({"trainer_overrides": {"normalize_advantages": 1}}, "trainer_overrides.normalize_advantages: must be true"),
        ({"trainer_overrides": [1]}, "trainer_overrides: must be"),
        ({"gate_overrides": {"no_such_knob": 1}}, "gate_overrides.no_such_knob: not a setting"),
        ({"gate_overrides": {"max_fim_samples": 100_000}}, "gate_overrides.max_fim_samples: must be an integer"),
        ({"gate_overrides": {"batch_size": 4096}}, "gate_overrides.batch_size: not a setting"),
        (
            {"gate_overrides": {"feedback_direction_z": None}},
            "gate_overrides.feedback_direction_z: must be a number from 0 to 20",
        ),
    ],
)
def test_a_tenant_override_outside_the_allow_list_or_its_range_is_a_400_naming_key_and_range(
    settings, client_a, tiny_adapter, body, words
):
    settings.VLLM_MAX_LORA_RANK = 16
    before = TrainingPolicy.objects.get(adapter=tiny_adapter)
    response = client_a.patch("/v1/adapters/tab/training-policy", body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["message"].startswith(words), response.json()
    after = TrainingPolicy.objects.get(adapter=tiny_adapter)
    assert (after.trainer_overrides, after.gate_overrides) == (before.trainer_overrides, before.gate_overrides)


@pytest.mark.django_db
def test_allowed_overrides_are_stored_and_the_policy_lists_every_key_with_its_range(client_a, tiny_adapter):
    trainer = {"epochs": 3, "learning_rate": 5e-4, "target_kl": None}
    body = {"trainer_overrides": trainer, "gate_overrides": {"max_kl": 1, "feedback_direction_z": 0}}
    response = client_a.patch("/v1/adapters/tab/training-policy", body, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["trainer_overrides"] == {"epochs": 3, "learning_rate": 5e-4, "target_kl": None}
    assert response.json()["gate_overrides"] == {"max_kl": 1.0, "feedback_direction_z": 0.0}
    limits = client_a.get("/v1/adapters/tab/training-policy").json()["override_limits"]
    assert limits["trainer_overrides"]["epochs"] == "an integer from 1 to 4"
    assert "device" not in limits["trainer_overrides"] and "max_lora_rank" not in limits["trainer_overrides"]
    assert limits["gate_overrides"]["max_kl"] == "a number from 0.01 to 5"
    assert limits["gate_overrides"]["feedback_direction_z"] == "a number from 0 to 20"


@pytest.mark.django_db
def test_the_gpu_queue_holds_one_waiting_run_per_tenant_so_another_tenant_waits_behind_one_not_all(
    make_tenant, tiny_adapter
):
    """Tenant A has three adapters and room for three runs; B's one run, scheduled after all of
    A's, is sent to the queue second, and A's next only when A's first was claimed."""
    greedy = make_tenant("greedy")
    greedy.max_concurrent_training_runs = 3
    greedy.save()
    base = tiny_adapter.base_model
    a_runs = [training_schedule(adapter_create(greedy, name=f"a{i}", base_model=base), force=True) for i in range(3)]
    b_run = training_schedule(tiny_adapter, force=True)
    assert all(run is not None for run in [*a_runs, b_run])

    def dispatched() -> list[int]:
        rows = TrainingRun.objects.filter(status="queued", dispatched_at__isnull=False).order_by("dispatched_at", "id")
        return list(rows.values_list("pk", flat=True))

    assert dispatched() == [a_runs[0].pk, b_run.pk]  # the queue: A's first, then B's
    assert training_run_claim(a_runs[0].pk, attempt=1) is not None
    assert dispatched() == [b_run.pk, a_runs[1].pk]  # A's second goes behind B's
    assert training_run_claim(b_run.pk, attempt=1) is not None
    assert dispatched() == [a_runs[1].pk]
    assert training_run_claim(a_runs[1].pk, attempt=1) is not None
    assert dispatched() == [a_runs[2].pk]


@pytest.mark.django_db
def test_the_reaper_ends_a_run_past_its_wall_time_failed_even_while_its_worker_still_beats(settings, tiny_adapter):
    settings.TRAINING_MAX_RUN_S = 600
    run = TrainingRun.objects.create(tenant=tiny_adapter.tenant, adapter=tiny_adapter)
    assert training_run_claim(run.pk, attempt=1) is not None
    TrainingRun.objects.filter(pk=run.pk).update(
        status="training", started_at=timezone.now() - timedelta(seconds=700), heartbeat_at=timezone.now()
    )
    assert training_reap_stale(stale_after_s=60) == []  # failed, not requeued
    run.refresh_from_db()
    assert (run.status, run.attempt) == ("failed", 1)
    assert "wall-time limit of 600 s" in run.error and run.finished_at is not None


@pytest.mark.django_db(transaction=True)
def test_runs_past_the_wall_time_limit_end_failed_with_the_reason_and_free_the_gpu_worker(
    tiny_adapter, add_events, celery_workers
):
    """With a limit of 0 s every run stops at its first check: the gpu worker ends each failed
    and goes on to the next, another adapter's."""
    workers = celery_workers
    workers.kill("gpu")
    workers.env["TRAINING_MAX_RUN_S"] = "0"
    workers.start_gpu()
    tenant = tiny_adapter.tenant
    tenant.max_concurrent_training_runs = 2
    tenant.save()
    other = adapter_create(tenant, name="other", base_model=tiny_adapter.base_model)
    add_events(12)
    runs = [training_schedule(tiny_adapter, force=True), training_schedule(other, force=True)]

    def finished():
        rows = TrainingRun.objects.filter(pk__in=[r.pk for r in runs], status__in=TERMINAL)
        return list(rows) if rows.count() == 2 else None

    for run in wait_until(finished, timeout=180, what="both runs to end", workers=workers):
        assert run.status == "failed" and run.error.startswith("stopped: the run went past its wall-time limit")
        assert "Traceback" not in run.error and run.output_version is None
    assert not AdapterVersion.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_an_erase_while_a_run_trains_discards_the_run_reports_it_and_reruns_without_the_user(
    tiny_adapter, add_events, client_a, monkeypatch, execute_run
):
    """The run fixes its window (dev-0 is in it), then dev-0 is erased through the API: the report
    names the active run, the run registers nothing and ends failed, a new run is queued, and the
    mark that the run held an erased user outlives their data without their id."""
    import apps.training.pipeline as pipeline

    add_events(20)
    run = training_schedule(tiny_adapter, force=True)
    reports = []
    real_export = pipeline.dataset_export

    def export_then_erase(run_, **kwargs):
        window = real_export(run_, **kwargs)
        reports.append(client_a.delete("/v1/users/dev-0"))
        return window

    monkeypatch.setattr(pipeline, "dataset_export", export_then_erase)
    assert execute_run(run) == "failed"

    report = reports[0]
    assert report.status_code == 200, report.content
    [entry] = report.json()["training_runs"]
    assert entry["run"] == run.pk and entry["status"] == "exporting" and entry["action"].startswith("discarded")
    run.refresh_from_db()
    assert run.status == "failed" and run.error.startswith("discarded: an end user in its window was erased")
    assert run.output_version is None and not AdapterVersion.objects.exists()
    rerun = TrainingRun.objects.exclude(pk=run.pk).get()
    assert (rerun.status, rerun.trigger) == ("queued", RERUN_TRIGGER)
    [mark] = TrainingRunErasure.objects.filter(run=run)
    assert mark.user_hash == erased_user_hash(tiny_adapter.tenant, "dev-0") and "dev-0" not in mark.user_hash
    assert not Interaction.objects.filter(end_user_id="dev-0").exists()


@pytest.mark.django_db
def test_a_version_that_learned_from_an_erased_user_stays_marked_and_its_lineage_retrains_in_one_action(
    tenant, tiny_adapter, add_events, client_a, make_lora_adapter
):
    ids = add_events(10)
    v1 = adapter_version_register(tenant, adapter=tiny_adapter, source_dir=make_lora_adapter(1), enqueue_load=False)
    v2 = adapter_version_register(
        tenant, adapter=tiny_adapter, source_dir=make_lora_adapter(2), parent=v1, enqueue_load=False
    )
    run1 = TrainingRun.objects.create(tenant=tenant, adapter=tiny_adapter, status="candidate", output_version=v1)
    run2 = TrainingRun.objects.create(
        tenant=tenant, adapter=tiny_adapter, status="candidate", parent_version=v1, output_version=v2
    )
    # v1 learned from dev-1..dev-4 only; v2 learned from dev-0 (and inherits v1).
    for interaction in Interaction.objects.filter(pk__in=ids).prefetch_related("feedback"):
        run = run2 if interaction.end_user_id == "dev-0" else run1
        for feedback in interaction.feedback.all():
            TrainingRunEvent.objects.create(run=run, feedback=feedback, held_out=False, reward=0.0)

    assert client_a.post("/v1/adapters/tab/retrain").status_code == 409  # nothing learned from an erased user yet
    report = end_user_erase(tenant, external_id="dev-0", actor="test").as_dict()
    assert [v["version"] for v in report["versions_trained_on"]] == [2]
    assert [(r["run"], r["status"], r["version"]) for r in report["training_runs"]] == [(run2.pk, "candidate", 2)]
    assert report["retrain"] == [{"adapter": "tab", "how": report["retrain"][0]["how"]}]
    assert "/v1/adapters/tab/retrain" in report["retrain"][0]["how"]
    assert client_a.get(f"/v1/training-runs/{run2.pk}").json()["erased_users"] == 1
    assert client_a.get(f"/v1/training-runs/{run1.pk}").json()["erased_users"] == 0

    started = client_a.post("/v1/adapters/tab/retrain")
    assert started.status_code == 202, started.content
    assert (started.json()["parent_version"], started.json()["trigger"]) == (1, "retrain without erased users")
    assert client_a.post("/v1/adapters/tab/retrain").status_code == 409  # one run at a time
    assert TrainingRunErasure.objects.filter(run=run2).count() == 1  # the mark outlives the data


@pytest.mark.django_db(transaction=True)
def test_an_erase_that_meets_a_run_registering_its_version_waits_for_it_and_names_the_version(
    tiny_adapter, policy, add_events, make_lora_adapter
):
    """The pipeline registers a version with the run's row locked; an erase of a user in its window
    that comes meanwhile waits for the commit, then reports the version (not a discarded run) and
    marks it. Without the erase's lock the registration commits only after 60 s, and the erase
    has read the run without its version by then. Nothing is held out (``policy``): the user's events
    are in the trained part whatever the run's id seeds."""
    import threading

    from django.db import connection, transaction

    from apps.training.dataset import dataset_export
    from apps.training.selectors import training_policy_get
    from apps.training.services import training_run_advance

    add_events(10)
    run = training_run_claim(training_schedule(tiny_adapter, force=True).pk, attempt=1)
    dataset_export(run, policy=training_policy_get(tiny_adapter))
    assert training_run_advance(run, status="evaluating")
    source = make_lora_adapter(4)
    locked = threading.Event()

    def register() -> None:
        try:
            with transaction.atomic():
                TrainingRun.objects.select_for_update().get(pk=run.pk)
                locked.set()
                version = adapter_version_register(
                    tiny_adapter.tenant, adapter=tiny_adapter, source_dir=source, enqueue_load=False
                )
                TrainingRun.objects.filter(pk=run.pk).update(output_version=version)
                # Commit only once the erase waits for this row (an ungranted lock), so an erase
                # that did not wait would have read the run before its version.
                wait_for_a_waiting_lock()
        finally:
            connection.close()

    registering = threading.Thread(target=register)
    registering.start()
    assert locked.wait(timeout=30)
    report = end_user_erase(tiny_adapter.tenant, external_id="dev-0", actor="test").as_dict()
    registering.join(timeout=30)
    [entry] = report["training_runs"]
    assert (entry["run"], entry["version"]) == (run.pk, 1), report
    assert entry["action"].startswith("version 1 learned from this user")
    assert [r["adapter"] for r in report["retrain"]] == ["tab"]
    assert TrainingRunErasure.objects.filter(run=run, trained_on=True).count() == 1


@pytest.mark.django_db
def test_erasure_marks_are_keyed_with_their_own_key_so_rotating_secret_key_keeps_them(tenant, settings):
    mark = erased_user_hash(tenant, "dev-0")
    settings.SECRET_KEY = "rotated-" + settings.SECRET_KEY[::-1]
    assert erased_user_hash(tenant, "dev-0") == mark
    settings.ERASURE_MARK_KEY = "another-" + settings.ERASURE_MARK_KEY
    assert erased_user_hash(tenant, "dev-0") != mark


@pytest.mark.django_db(transaction=True)
def test_an_erase_meeting_a_requeue_that_locks_a_later_run_first_waits_instead_of_deadlocking(
    tenant, tiny_adapter, add_events
):
    """A requeue locks the tenant, its run, then the queued run it sends next, which may have the
    lower id; an erase locks the tenant's active runs in id order. The erase takes the tenant's
    lock first, so it waits for the requeue; locking the runs alone it would hold the lower one and
    wait for the higher, while the requeue waits for the lower: a deadlock, one of them aborted."""

    from django.db import transaction

    from apps.training.services.scheduling import tenant_lock

    tenant.max_concurrent_training_runs = 2
    tenant.save()
    other = adapter_create(tenant, name="chat", base_model=tiny_adapter.base_model)
    add_events(5)  # one of each of five developers
    lower = training_schedule(tiny_adapter, force=True)
    higher = training_schedule(other, force=True)
    assert lower is not None and higher is not None and lower.pk < higher.pk

    def requeue(holding) -> None:
        with transaction.atomic():
            tenant_lock(tenant.pk)
            TrainingRun.objects.select_for_update().get(pk=higher.pk)
            holding.set()
            # Go on only once the erase waits for a lock (an ungranted one), as a requeue that
            # meets an erase mid-way would.
            wait_for_a_waiting_lock()
            TrainingRun.objects.select_for_update().get(pk=lower.pk)

    with held_in_a_thread(requeue):  # a deadlock that aborts the requeue fails the test
        report = end_user_erase(tenant, external_id="dev-0", actor="test")
    assert report.deleted["interactions"] == 1
