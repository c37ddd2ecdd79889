"""A promotion by hand while the adapter has a running experiment: the experiment compares against
production, so it is decided (its own candidate promoted) or stopped first (any other version), never
left serving its control arm a retired version and promoting its candidate over the new one later."""

from __future__ import annotations

import pytest

from apps.adapters.models import Adapter, AdapterVersion
from apps.adapters.services import adapter_version_promote
from apps.experiments.models import Experiment
from apps.experiments.services import experiment_create, experiment_start
from apps.tenants.models import AuditEvent

pytestmark = [pytest.mark.vllm, pytest.mark.django_db]


@pytest.fixture
def admin(serving_tenant, make_client):
    return make_client(serving_tenant, scopes=["serve", "feedback", "admin", "ingest"])


@pytest.fixture
def running(serving_tenant, serving_adapter, probed_version):
    """Production v1, a running experiment of v3 against it, and v2 beside them (a candidate)."""
    v1 = probed_version(seed=61)
    adapter_version_promote(serving_tenant, version=v1, actor="test")
    v2 = probed_version(seed=62, parent=v1)
    v3 = probed_version(seed=63, parent=v1)
    experiment = experiment_create(serving_tenant, adapter=serving_adapter, candidate_version=v3, actor="test")
    experiment = experiment_start(serving_tenant, experiment=experiment, actor="test")
    return v1, v2, v3, experiment


def test_promoting_another_version_by_hand_stops_the_running_experiment_first(admin, serving_adapter, running):
    v1, v2, v3, experiment = running
    response = admin.post(f"/v1/adapters/{serving_adapter.name}/versions/{v2.number}/promote")
    assert response.status_code == 200, response.content
    assert response.json()["production_version"] == v2.number
    experiment.refresh_from_db()
    assert experiment.status == Experiment.Status.STOPPED
    assert f"version {v2.number} promoted by hand" in experiment.decision_reason
    statuses = dict(AdapterVersion.objects.filter(pk__in=[v1.pk, v2.pk, v3.pk]).values_list("pk", "status"))
    assert statuses == {
        v1.pk: AdapterVersion.Status.RETIRED,
        v2.pk: AdapterVersion.Status.PRODUCTION,
        v3.pk: AdapterVersion.Status.CANDIDATE,  # still a candidate, for a later experiment
    }
    assert AuditEvent.objects.filter(action="experiment.stop", target_id=str(experiment.pk)).exists()


def test_promoting_the_experiments_candidate_by_hand_decides_the_experiment(admin, serving_adapter, running):
    v1, _, v3, experiment = running
    response = admin.post(f"/v1/adapters/{serving_adapter.name}/versions/{v3.number}/promote")
    assert response.status_code == 200, response.content
    experiment.refresh_from_db()
    assert experiment.status == Experiment.Status.DECIDED and experiment.decision == "promote"
    assert Adapter.objects.get(pk=serving_adapter.pk).production_version_id == v3.pk
    assert AdapterVersion.objects.get(pk=v1.pk).status == AdapterVersion.Status.RETIRED


def test_a_draft_made_before_its_candidate_was_promoted_elsewhere_cannot_start(
    serving_tenant, serving_adapter, probed_version
):
    from apps.common.exceptions import Conflict
    from apps.experiments.services import experiment_promote

    v1 = probed_version(seed=71)
    adapter_version_promote(serving_tenant, version=v1, actor="test")
    v2 = probed_version(seed=72, parent=v1)
    stale = experiment_create(serving_tenant, adapter=serving_adapter, candidate_version=v2, actor="test")
    other = experiment_create(serving_tenant, adapter=serving_adapter, candidate_version=v2, actor="test")
    experiment_start(serving_tenant, experiment=other, actor="test")
    experiment_promote(serving_tenant, experiment=other, actor="test")  # v2 is production now
    with pytest.raises(Conflict) as refused:
        experiment_start(serving_tenant, experiment=stale, actor="test")
    assert refused.value.code == "not_a_candidate" and "is production now" in refused.value.message
    assert Experiment.objects.get(pk=stale.pk).status == Experiment.Status.DRAFT


def test_a_rollback_whose_version_cannot_load_leaves_the_experiment_running(
    admin, serving_adapter, running, monkeypatch
):
    import apps.experiments.services.production as production
    from apps.common.exceptions import ServiceUnavailable

    v1, v2, _, experiment = running
    adapter_version_promote(serving_adapter.tenant, version=v2, actor="test")  # v1 is earlier than production

    def vllm_down(version):
        raise ServiceUnavailable("vLLM is down")

    monkeypatch.setattr(production, "adapter_version_load_everywhere", vllm_down)
    response = admin.post(f"/v1/adapters/{serving_adapter.name}/rollback", {"version": v1.number}, format="json")
    assert response.status_code == 503, response.content
    experiment.refresh_from_db()
    assert experiment.status == Experiment.Status.RUNNING  # nothing changed
