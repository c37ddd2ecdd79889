"""One experiment runs per adapter: a start asked while another runs is refused before anything is
made or loaded (a draft alone may still be made, to start once the adapter is free)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from apps.adapters.models import AdapterVersion
from apps.experiments.models import Experiment
from apps.tenants.models import AuditEvent

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(tenant, make_running_experiment, monkeypatch) -> tuple[Experiment, AdapterVersion]:
    """The adapter's running experiment and a second candidate beside it; vLLM must not be asked."""
    import apps.experiments.services.lifecycle as lifecycle

    def no_load(version: AdapterVersion) -> None:
        raise AssertionError(f"{version.vllm_name} was loaded for a start that cannot happen")

    monkeypatch.setattr(lifecycle, "adapter_version_load_everywhere", no_load)
    experiment = make_running_experiment(tenant, "tab", is_default=True)
    candidate = AdapterVersion.objects.create(
        tenant=tenant, adapter=experiment.adapter, number=2, artifact_path="/x/tab-v2", vllm_name="t--tab--v2",
        status="candidate", loaded_at=timezone.now(),
    )  # fmt: skip
    return experiment, candidate


def test_creating_and_starting_while_an_experiment_runs_is_a_409_that_makes_nothing(make_client, tenant, running):
    experiment, candidate = running
    client = make_client(tenant, scopes=["admin"])

    response = client.post("/v1/adapters/tab/experiments", {"candidate_version": 2, "start": True}, format="json")

    assert response.status_code == 409, response.content
    assert response.json()["error"]["code"] == "experiment_running"
    assert f"experiment {experiment.pk} is already running on tab" in response.json()["error"]["message"]
    assert list(Experiment.objects.filter(tenant=tenant)) == [experiment]
    assert not AuditEvent.objects.filter(tenant=tenant, action="experiment.create").exists()


def test_a_draft_made_while_an_experiment_runs_is_refused_at_its_start_before_loading(make_client, tenant, running):
    experiment, candidate = running
    client = make_client(tenant, scopes=["admin"])

    created = client.post("/v1/adapters/tab/experiments", {"candidate_version": 2}, format="json")
    assert created.status_code == 201, created.content
    started = client.post(f"/v1/experiments/{created.json()['id']}/start")

    assert started.status_code == 409 and started.json()["error"]["code"] == "experiment_running"
    assert Experiment.objects.get(pk=created.json()["id"]).status == Experiment.Status.DRAFT
    candidate.refresh_from_db()
    assert candidate.status == AdapterVersion.Status.CANDIDATE
