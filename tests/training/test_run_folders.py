"""A run's working folder (the parent's weights fetched, the candidate's written) goes when the run
ends, so weights trained on an end user do not outlive an erase or a purge on the GPU host; folders
a killed worker left are swept at the next run's start."""

from __future__ import annotations

from pathlib import Path

import pytest

from apps.interactions.services import feedback_ingest, interactions_ingest
from apps.training.models import TrainingPolicy, TrainingRun
from apps.training.pipeline import run_dir_of, run_dirs_sweep
from apps.training.services import training_schedule


@pytest.mark.django_db(transaction=True)  # the run's heartbeat reads it from a connection of its own
def test_a_trained_run_leaves_no_weights_in_its_folder_and_its_version_keeps_its_own(
    settings, tmp_path, tiny_adapter, execute_run
):
    settings.STROP_RUN_ROOT = tmp_path / "runs"
    tenant = tiny_adapter.tenant
    items = [
        {
            "client_id": f"c-{k}",
            "prompt": f"value_{k} = ",
            "completion": "42",
            "prompt_token_ids": [1400 + (k * 7 + j) % 150 for j in range(12)],
            "completion_token_ids": [1550 + (k * 3 + j) % 100 for j in range(4)],
            "completion_logprobs": [-0.5] * 4,
            "end_user_id": f"dev-{k % 4}",
            "opted_in": True,
        }
        for k in range(16)
    ]
    results = interactions_ingest(tenant, items=items)
    outcomes = [{"client_id": r.client_id, "outcome": ("accepted", "rejected")[k % 2]} for k, r in enumerate(results)]
    feedback_ingest(tenant, items=outcomes)
    TrainingPolicy.objects.filter(adapter=tiny_adapter).update(heldout_fraction=0.0)
    run = training_schedule(tiny_adapter, force=True)
    assert execute_run(run) == "candidate"
    run.refresh_from_db()
    assert not run_dir_of(run).exists()
    assert not list((tmp_path / "runs").rglob("*.safetensors"))
    assert (Path(run.output_version.artifact_path) / "adapter_model.safetensors").exists()


@pytest.mark.django_db
def test_the_sweep_removes_only_the_folders_of_this_databases_ended_runs(settings, tmp_path, tiny_adapter):
    settings.STROP_RUN_ROOT = tmp_path
    active = TrainingRun.objects.create(tenant=tiny_adapter.tenant, adapter=tiny_adapter, status="training", attempt=2)
    done = TrainingRun.objects.create(tenant=tiny_adapter.tenant, adapter=tiny_adapter, status="rejected")
    owned = run_dir_of(active)
    taken_back = owned.with_name(f"run-{active.pk}-attempt-1")  # its worker may still be writing: kept
    ended = run_dir_of(done)
    elsewhere = tmp_path / "other-co" / "tab" / f"run-{done.pk}-attempt-1"  # not this run's tenant
    unknown = tmp_path / tiny_adapter.tenant.slug / "tab" / f"run-{done.pk + 1000}-attempt-1"  # no such run here
    notes = tmp_path / tiny_adapter.tenant.slug / "tab" / "notes"
    for folder in (owned, taken_back, ended, elsewhere, unknown, notes):
        (folder / "adapter").mkdir(parents=True)
        (folder / "adapter" / "adapter_model.safetensors").write_bytes(b"weights")
    assert run_dirs_sweep() == [ended]
    assert not ended.exists() and all(f.exists() for f in (owned, taken_back, elsewhere, unknown, notes))
    TrainingRun.objects.filter(pk=active.pk).update(status="candidate")
    assert sorted(run_dirs_sweep()) == sorted([owned, taken_back])
    assert run_dirs_sweep() == []
