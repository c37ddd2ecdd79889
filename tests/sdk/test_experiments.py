"""Adapter versions and experiments through the SDK, against the live API and the session's real
vLLM: candidates are random LoRAs with the serve probe the trainer records (``probed_version``)."""

from __future__ import annotations

import pytest
from strop import AdapterVersion, Assignment, ConflictError, Experiment, NotFoundError, Snapshot

from apps.adapters.models import Adapter as AdapterRow
from apps.experiments.models import Experiment as ExperimentRow
from apps.experiments.models import ExperimentExposure

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True)]

ADAPTER = "autocomplete"
GUARDRAILS = ["accepted_per_request", "error_rate"]


def test_an_experiment_is_created_started_measured_and_stopped(admin_sdk, probed_version, served):
    candidate = probed_version(seed=51)
    draft = admin_sdk.experiments.create(
        ADAPTER, candidate_version=candidate.number, expected_users=48, guardrails=GUARDRAILS
    )
    assert isinstance(draft, Experiment) and (draft.status, draft.candidate_version, draft.control_version) == (
        "draft",
        candidate.number,
        None,
    )
    assert (draft.config["n_star"], draft.config["guardrails"], draft.latest) == (48.0, GUARDRAILS, None)
    assert [experiment.id for experiment in admin_sdk.experiments.list(ADAPTER)] == [draft.id]

    running = admin_sdk.experiments.start(draft.id)
    assert running.status == "running" and running.started_at is not None
    users = [f"dev-{n}" for n in range(3)]
    assignments = [admin_sdk.experiments.assignment(ADAPTER, user, opted_in=True) for user in users]
    assert all(isinstance(a, Assignment) and a.experiment == draft.id for a in assignments)
    for assignment in assignments:
        arm_version = candidate.number if assignment.arm == "candidate" else None
        arm_model = candidate.vllm_name if assignment.arm == "candidate" else served.served_model_name
        assert (assignment.version, assignment.model) == (arm_version, arm_model)
    outsider = admin_sdk.experiments.assignment(ADAPTER, "dev-out", opted_in=False)
    assert (outsider.arm, outsider.version) == (None, None)  # production: the base model
    assert ExperimentExposure.objects.filter(experiment_id=draft.id).count() == 3

    measured = admin_sdk.experiments.snapshot(draft.id)
    assert isinstance(measured.latest, Snapshot) and measured.latest.users == 3
    assert measured.latest.action == measured.latest.analysis["decision"]["action"]
    (snapshot,) = admin_sdk.experiments.snapshots(draft.id)
    assert snapshot == measured.latest and admin_sdk.experiments.get(draft.id).latest == snapshot

    stopped = admin_sdk.experiments.stop(draft.id, reason="enough")
    assert stopped.status == "stopped" and stopped.ended_at is not None
    assert ExperimentRow.objects.get(pk=draft.id).status == "stopped"
    with pytest.raises(ConflictError):
        admin_sdk.experiments.stop(draft.id)
    events = admin_sdk.audit_events.list()
    actions = [e.action for e in events if (e.target_type, e.target_id) == ("experiment", str(draft.id))]
    assert actions == ["experiment.stop", "experiment.start", "experiment.create"]


def test_a_promoted_experiment_makes_its_candidate_production_and_production_rolls_back(admin_sdk, probed_version):
    first = probed_version(seed=52)
    adapter = admin_sdk.adapters.versions.promote(ADAPTER, first.number)
    assert adapter.production_version == first.number
    second = probed_version(seed=53, parent=first)
    versions = {version.number: version for version in admin_sdk.adapters.versions.list(ADAPTER)}
    assert all(isinstance(version, AdapterVersion) for version in versions.values())
    assert (versions[first.number].status, versions[second.number].status) == ("production", "candidate")
    assert versions[second.number].parent == first.number and versions[second.number].vllm_name == second.vllm_name
    assert admin_sdk.adapters.versions.get(ADAPTER, second.number) == versions[second.number]
    with pytest.raises(NotFoundError):
        admin_sdk.adapters.versions.get(ADAPTER, second.number + 1)

    experiment = admin_sdk.experiments.create(ADAPTER, candidate_version=second.number, start=True)
    assert (experiment.status, experiment.control_version) == ("running", first.number)
    promoted = admin_sdk.experiments.promote(experiment.id, reason="looks good")
    assert (promoted.status, promoted.decision) == ("decided", "promote")
    assert admin_sdk.adapters.get(ADAPTER).production_version == second.number

    rolled_back = admin_sdk.adapters.rollback(ADAPTER, version=first.number)
    assert rolled_back.production_version == first.number
    assert AdapterRow.objects.get(name=ADAPTER).production_version.number == first.number
    assert admin_sdk.adapters.versions.get(ADAPTER, first.number).status == "production"


def test_a_rolled_back_experiment_retires_its_candidate_and_production_stays(admin_sdk, probed_version):
    candidate = probed_version(seed=54)
    experiment = admin_sdk.experiments.create(ADAPTER, candidate_version=candidate.number, start=True)
    rolled_back = admin_sdk.experiments.rollback(experiment.id, reason="worse")
    assert (rolled_back.status, rolled_back.decision) == ("decided", "rollback")
    assert admin_sdk.adapters.versions.get(ADAPTER, candidate.number).status == "retired"
    assert admin_sdk.adapters.get(ADAPTER).production_version is None
    with pytest.raises(ConflictError):
        admin_sdk.experiments.promote(experiment.id)
    assert ExperimentRow.objects.get(pk=experiment.id).decision == "rollback"
