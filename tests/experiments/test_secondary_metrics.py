"""An experiment's secondary metrics (reported, deciding nothing) are set on create, over the API
and on the dashboard's form, as docs/experiments.md says (an agent adapter picks the positive rates)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from apps.adapters.models import Adapter, AdapterVersion, BaseModel
from apps.dashboard.forms import ExperimentStartForm
from apps.experiments.models import Experiment

pytestmark = pytest.mark.django_db


@pytest.fixture
def candidate(tenant) -> AdapterVersion:
    base = BaseModel.objects.create(name="b", path="/nonexistent", family="qwen")
    adapter = Adapter.objects.create(tenant=tenant, name="agent", base_model=base, is_default=True)
    return AdapterVersion.objects.create(
        tenant=tenant, adapter=adapter, number=1, artifact_path="/nonexistent/v1", status="candidate",
        vllm_name="acme--agent--v1-abcd", loaded_at=timezone.now(),
    )  # fmt: skip


def test_secondary_metrics_are_set_over_the_api_and_an_unknown_one_names_the_field(make_client, tenant, candidate):
    client = make_client(tenant, scopes=["admin"])
    body = {"candidate_version": 1, "secondary_metrics": ["positive_rate", "positive_session_rate"]}
    created = client.post("/v1/adapters/agent/experiments", body, format="json")
    assert created.status_code == 201, created.content
    config = Experiment.objects.get(pk=created.json()["id"]).config
    assert config["secondary_metrics"] == ["positive_rate", "positive_session_rate"]
    bad = client.post("/v1/adapters/agent/experiments", {**body, "secondary_metrics": ["nope"]}, format="json")
    assert bad.status_code == 400 and bad.json()["error"]["param"].startswith("secondary_metrics")


def test_the_start_form_offers_secondary_metrics_with_the_defaults_ticked(candidate):
    form = ExperimentStartForm(candidates=[(1, "v1")])
    assert form.fields["secondary_metrics"].initial == ["accept_rate", "accepted_per_request"]
    data = {"candidate_version": "1", "candidate_weight": "0.5", "primary_metric": "reward_per_request",
            "min_users_per_arm": "100", "max_duration_days": "14", "alpha": "0.05",
            "secondary_metrics": ["positive_rate"]}  # fmt: skip
    bound = ExperimentStartForm(data, candidates=[(1, "v1")])
    assert bound.is_valid(), bound.errors
    assert bound.config()["secondary_metrics"] == ["positive_rate"]
