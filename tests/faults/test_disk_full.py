"""The disk fills while a training run writes its adapter: the run fails naming ENOSPC, registers
nothing, leaves the adapter as it was, and leaves no partial directory behind.

The gpu worker's run root is a small tmpfs mounted for this test (it needs root, as here)."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.adapters.models import AdapterVersion
from apps.adapters.services import adapter_create, base_model_register
from apps.interactions.services import feedback_ingest, interactions_ingest
from apps.training.models import TrainingPolicy, TrainingRun
from apps.training.services import training_schedule
from tests.fixtures.workers import Workers, wait_until, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

# The tiny model's rank-8 LoRA is 128 KiB of fp32 weights: it cannot fit, its config can.
TMPFS_SIZE = "64k"


def _unmount(mount: Path) -> None:
    if subprocess.run(["umount", str(mount)], capture_output=True).returncode != 0:
        subprocess.run(["umount", "--lazy", str(mount)], capture_output=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "runs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0755", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.fail(
            f"this test fills a {TMPFS_SIZE} tmpfs mounted at {mount}, and the mount failed "
            f"({done.returncode}: {(done.stderr or done.stdout).strip()}); it needs root or CAP_SYS_ADMIN",
            pytrace=False,
        )
    try:
        yield mount
    finally:
        _unmount(mount)


@pytest.fixture
def gpu_worker_on_small_disk(small_disk: Path, settings, tmp_path: Path) -> Iterator[Workers]:
    from config.celery import app

    app.control.purge()  # messages left by earlier tests name rows that no longer exist
    workers = Workers(env=worker_env(settings, run_root=small_disk), log_dir=tmp_path)
    workers.start_gpu()
    try:
        yield workers
    finally:
        workers.stop_all()  # before the tmpfs is unmounted
        app.control.purge()


def _labelled_events(tenant, count: int) -> None:
    items = [
        {
            "client_id": f"disk-{i}",
            "prompt": f"x{i} = ",
            "completion": "1",
            "prompt_token_ids": [5, 6, 7 + i],
            "completion_token_ids": [8 + i, 9],
            "completion_logprobs": [-0.5, -1.0],
            "end_user_id": "dev-1",
            "opted_in": True,
        }
        for i in range(count)
    ]
    interactions_ingest(tenant, items=items)
    outcomes = ["accepted", "rejected"]
    feedback_ingest(tenant, items=[{"client_id": f"disk-{i}", "outcome": outcomes[i % 2]} for i in range(count)])


def test_a_disk_that_fills_while_the_adapter_is_written_fails_the_run_and_keeps_the_adapter(
    gpu_worker_on_small_disk, small_disk, make_tenant, tiny_starter_model, settings
):
    workers = gpu_worker_on_small_disk
    tenant = make_tenant(f"disk-{uuid.uuid4().hex[:6]}")
    base = base_model_register(name="base", path=tiny_starter_model)
    adapter = adapter_create(tenant, name="tab", base_model=base, is_default=True)
    TrainingPolicy.objects.create(
        tenant=tenant,
        adapter=adapter,
        min_new_events=12,
        heldout_fraction=0.25,
        trainer_overrides={"epochs": 1, "num_minibatches": 2},
    )
    _labelled_events(tenant, 12)
    run = training_schedule(adapter)
    assert run is not None

    def finished() -> TrainingRun | None:
        return TrainingRun.objects.filter(pk=run.pk, status__in=["candidate", "rejected", "failed"]).first()

    run = wait_until(finished, timeout=300, what="the run to end", workers=workers)
    assert run.status == "failed", (run.status, run.error)
    first_line = run.error.splitlines()[0]
    assert "no space left on device (ENOSPC) while writing the adapter" in first_line, run.error
    assert run.window_size > 0 and run.trainer_summary == {}  # it trained, then could not write

    assert not AdapterVersion.objects.filter(adapter=adapter).exists()  # nothing registered
    adapter.refresh_from_db()
    assert adapter.production_version is None  # the adapter is as it was
    assert not list(Path(settings.STROP_ADAPTER_ROOT).rglob("*.safetensors"))
    left = [p for p in small_disk.rglob("*") if p.is_file() or p.name.startswith(".tmp-")]
    assert not left, f"the partial adapter was left behind: {left}"
