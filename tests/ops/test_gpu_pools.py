"""Several gpu workers, and training pools: real prefork gpu workers (one process each, as the
Procfile runs them) training real runs of the tiny starter model.

Which worker ran a run is read from its log (each logs the runs it starts); each worker here has a
``STROP_RUN_ROOT`` of its own. vLLM is not running (a dead address): a candidate's load is left to
the serving queue, which no worker here takes, and the run still ends."""

from __future__ import annotations

import itertools
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from apps.adapters.services import adapter_create, base_model_register
from apps.interactions.services import feedback_ingest, interactions_ingest
from apps.training.models import TrainingPolicy, TrainingRun
from apps.training.services import training_schedule, training_sweep_queued
from config.celery import app
from tests.fixtures.workers import Workers, wait_until, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

TERMINAL = ("candidate", "rejected", "failed")
DEAD_VLLM = "http://127.0.0.1:9"
_ids = itertools.count()


def _tenant_ready_to_train(make_tenant, base, slug: str):
    """A tenant with a tiny adapter and a labelled window of 12 events."""
    tenant = make_tenant(slug)
    adapter = adapter_create(tenant, name="tab", base_model=base, is_default=True)
    TrainingPolicy.objects.create(
        tenant=tenant, adapter=adapter, min_new_events=8, heldout_fraction=0.25, trainer_overrides={"epochs": 1}
    )
    items = []
    for _ in range(12):
        i = next(_ids)
        items.append(
            {
                "client_id": f"{slug}-{i}",
                "prompt": f"x{i} = ",
                "completion": "1",
                "prompt_token_ids": [5, 6, 7 + i % 50],
                "completion_token_ids": [8 + i % 40, 9],
                "completion_logprobs": [-0.5, -1.0],
                "end_user_id": f"dev-{i % 5}",
                "opted_in": True,
            }
        )
    results = interactions_ingest(tenant, items=items)
    outcomes = ["accepted", "rejected", "not_shown", "accepted"]
    feedback_ingest(
        tenant, items=[{"client_id": r.client_id, "outcome": outcomes[k % 4]} for k, r in enumerate(results)]
    )
    return tenant, adapter


class GpuWorkers:
    """gpu workers, each with a run root and a log of its own."""

    def __init__(self, settings, tmp_path: Path, **env: str) -> None:
        self.settings, self.tmp_path, self.env = settings, tmp_path, env
        self.started: dict[str, Workers] = {}

    def start(self, name: str, queue: str) -> None:
        env = worker_env(self.settings, run_root=self.root(name), VLLM_BASE_URLS=DEAD_VLLM, **self.env)
        workers = Workers(env=env, log_dir=self.tmp_path)
        workers.start(name, queue, "prefork", concurrency=1)
        self.started[name] = workers
        wait_until(lambda: " ready." in workers.log_tail(name, 400), timeout=300, what=f"{name} to start")

    def root(self, name: str) -> Path:
        return self.tmp_path / f"runs-{name}"

    def ran(self, run: TrainingRun) -> str:
        """The worker whose log says it started the run (its working directory goes when it ends)."""
        started = f"training run {run.pk} attempt {run.attempt} started"
        names = [name for name, workers in self.started.items() if started in workers.log_tail(name, 100_000)]
        assert len(names) == 1, f"run {run.pk} ran on {names}"
        return names[0]

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{w.log_tail(name)}" for name, w in self.started.items())

    def stop_all(self) -> None:
        for workers in self.started.values():
            workers.stop_all()


@pytest.fixture
def gpu_workers(settings, tmp_path):
    app.control.purge()  # messages left by earlier tests name rows that no longer exist
    started = GpuWorkers(settings, tmp_path, **_pools_env(settings))
    try:
        yield started
    finally:
        started.stop_all()
        app.control.purge()
        with app.connection_for_write() as connection:
            for queue in set(settings.STROP_GPU_POOLS.values()):  # queues this process's app does not know
                connection.default_channel.queue_purge(queue)


def _pools_env(settings) -> dict[str, str]:
    pools: dict[str, list[str]] = {}
    for slug, queue in settings.STROP_GPU_POOLS.items():
        pools.setdefault(queue.removeprefix("gpu-"), []).append(slug)
    return {"STROP_GPU_POOLS": ";".join(f"{pool}:{','.join(slugs)}" for pool, slugs in pools.items())}


def _finished(run: TrainingRun, workers: GpuWorkers, timeout: float = 600) -> TrainingRun:
    def done() -> TrainingRun | None:
        run.refresh_from_db()
        return run if run.status in TERMINAL else None

    wait_until(done, timeout=timeout, what=f"run {run.pk} to finish\n{workers.logs()}")
    return run


def test_two_gpu_workers_train_two_tenants_at_the_same_time(make_tenant, tiny_starter_model, gpu_workers):
    base = base_model_register(name="base", path=tiny_starter_model)
    tenants = [_tenant_ready_to_train(make_tenant, base, slug) for slug in ("ops-one", "ops-two")]
    gpu_workers.start("gpu-a", "gpu")
    gpu_workers.start("gpu-b", "gpu")

    started = time.monotonic()
    runs = [training_schedule(adapter, force=True) for _, adapter in tenants]  # one message each, at once
    assert all(run is not None for run in runs)
    finished = [_finished(run, gpu_workers) for run in runs]
    wall_s = time.monotonic() - started

    assert {run.status for run in finished} <= {"candidate", "rejected"}, [(r.status, r.error) for r in finished]
    assert {gpu_workers.ran(run) for run in finished} == {"gpu-a", "gpu-b"}  # one each
    first, second = finished
    assert first.started_at < second.finished_at and second.started_at < first.finished_at  # overlapping
    print(f"two runs on two gpu workers: {wall_s:.1f} s wall, runs {[r.stage_seconds for r in finished]}")


def test_a_pooled_tenants_run_waits_for_its_pools_worker_while_the_shared_worker_trains_others(
    make_tenant, tiny_starter_model, settings, gpu_workers
):
    settings.STROP_GPU_POOLS = {"ops-pooled": "gpu-pool-a"}
    base = base_model_register(name="base", path=tiny_starter_model)
    pooled_tenant, pooled_adapter = _tenant_ready_to_train(make_tenant, base, "ops-pooled")
    _, shared_adapter = _tenant_ready_to_train(make_tenant, base, "ops-shared")
    gpu_workers.env = _pools_env(settings)
    gpu_workers.start("gpu-shared", "gpu")

    pooled = training_schedule(pooled_adapter, force=True)  # sent first ...
    shared = training_schedule(shared_adapter, force=True)
    assert pooled is not None and shared is not None
    _finished(shared, gpu_workers)  # ... yet the free shared worker took only the other tenant's
    pooled.refresh_from_db()
    assert pooled.status == "queued" and pooled.dispatched_at is not None
    with app.connection_for_read() as connection:
        assert connection.default_channel.queue_declare(queue="gpu-pool-a", passive=True).message_count == 1

    gpu_workers.start("gpu-pool-a", "gpu-pool-a")
    _finished(pooled, gpu_workers)
    assert gpu_workers.ran(pooled) == "gpu-pool-a"
    assert gpu_workers.ran(shared) == "gpu-shared"


def test_the_sweeper_counts_each_pools_queue_on_its_own(make_tenant, tiny_starter_model, settings, gpu_workers):
    """A lost message of a pooled run is sent again to its pool's queue, while the shared gpu queue,
    which still holds its run's message, gets nothing new."""
    settings.STROP_GPU_POOLS = {"ops-pooled": "gpu-pool-a"}
    base = base_model_register(name="base", path=tiny_starter_model)
    pooled = training_schedule(_tenant_ready_to_train(make_tenant, base, "ops-pooled")[1], force=True)
    shared = training_schedule(_tenant_ready_to_train(make_tenant, base, "ops-shared")[1], force=True)
    assert pooled is not None and shared is not None
    TrainingRun.objects.update(dispatched_at=timezone.now() - timedelta(minutes=5))

    def lengths() -> tuple[int, int]:
        with app.connection_for_read() as connection:
            channel = connection.default_channel
            return tuple(channel.queue_declare(queue=q, passive=True).message_count for q in ("gpu-pool-a", "gpu"))

    assert lengths() == (1, 1)
    assert training_sweep_queued(older_than_s=60) == []  # both waiting, none lost
    with app.connection_for_write() as connection:
        connection.default_channel.queue_purge("gpu-pool-a")  # the broker loses the pooled run's message
    assert training_sweep_queued(older_than_s=60) == [pooled.pk]
    assert lengths() == (1, 1)
