"""A training policy with ``auto_experiment`` puts each candidate a run registers in front of users
at once (real vLLM: the candidate is loaded and serve-probed like any start)."""

from __future__ import annotations

import pytest

from apps.adapters.models import AdapterVersion
from apps.experiments.models import Experiment
from apps.training.models import TrainingRun
from apps.training.services import training_policy_update
from workers.training import experiment_auto_start

pytestmark = [pytest.mark.vllm, pytest.mark.django_db]


def _run_with(tenant, adapter, version) -> TrainingRun:
    return TrainingRun.objects.create(
        tenant=tenant, adapter=adapter, status=TrainingRun.Status.CANDIDATE, output_version=version
    )


def test_a_policy_that_asks_starts_an_experiment_with_each_new_candidate_unless_one_runs(
    serving_tenant, serving_adapter, probed_version
):
    first = probed_version(1)
    experiment_auto_start(_run_with(serving_tenant, serving_adapter, first).pk)
    assert not Experiment.objects.exists()  # the default policy does not ask

    training_policy_update(serving_tenant, adapter=serving_adapter, actor="test", changes={"auto_experiment": True})
    experiment_auto_start(_run_with(serving_tenant, serving_adapter, first).pk)
    experiment = Experiment.objects.get()
    assert (experiment.status, experiment.candidate_version_id) == (Experiment.Status.RUNNING, first.pk)
    assert experiment.created_by == f"training-run:{TrainingRun.objects.latest('id').pk}"

    second = probed_version(2, parent=first)
    experiment_auto_start(_run_with(serving_tenant, serving_adapter, second).pk)
    assert Experiment.objects.count() == 1  # the second candidate waits for a person
    second.refresh_from_db()
    assert second.status == AdapterVersion.Status.CANDIDATE


def test_a_candidate_that_cannot_be_tested_is_written_on_its_run(serving_tenant, serving_adapter, probed_version):
    training_policy_update(serving_tenant, adapter=serving_adapter, actor="test", changes={"auto_experiment": True})
    version = probed_version(3)
    AdapterVersion.objects.filter(pk=version.pk).update(status=AdapterVersion.Status.RETIRED)
    run = _run_with(serving_tenant, serving_adapter, version)
    experiment_auto_start(run.pk)
    run.refresh_from_db()
    assert not Experiment.objects.exists()
    assert "experiment not started: candidate_version: version" in run.log
