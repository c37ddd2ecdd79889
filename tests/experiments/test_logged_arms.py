"""Interactions a tenant serving elsewhere logs are counted in the experiment of the adapter they
name (by its name, or a version's vLLM name as the assignment endpoint answers it), never in the
default adapter's experiment when they name another adapter."""

from __future__ import annotations

import pytest
from django.utils import timezone

from apps.adapters.models import Adapter, AdapterVersion, BaseModel
from apps.cohorts.models import EndUser
from apps.experiments.models import Experiment
from apps.experiments.selectors import experiment_arms_of_logged
from apps.experiments.services import experiment_create, exposure_record

pytestmark = pytest.mark.django_db


def _adapter(tenant, base, name: str, *, default: bool) -> tuple[Adapter, AdapterVersion]:
    adapter = Adapter.objects.create(tenant=tenant, name=name, base_model=base, is_default=default)
    version = AdapterVersion.objects.create(
        tenant=tenant, adapter=adapter, number=1, artifact_path=f"/nonexistent/{name}", status="candidate",
        vllm_name=f"{tenant.slug}--{name}--v1-abcd", loaded_at=timezone.now(),
    )  # fmt: skip
    return adapter, version


def test_a_logged_interaction_counts_in_the_experiment_of_the_adapter_it_names(tenant):
    base = BaseModel.objects.create(name="b", path="/nonexistent", family="qwen")
    tab, tab_v1 = _adapter(tenant, base, "tab", default=True)
    chat, chat_v1 = _adapter(tenant, base, "chat", default=False)
    experiment = experiment_create(tenant, adapter=tab, candidate_version=tab_v1, actor="test")
    Experiment.objects.filter(pk=experiment.pk).update(status=Experiment.Status.RUNNING)
    experiment.refresh_from_db()
    EndUser.objects.create(tenant=tenant, external_id="u", opted_in=True)
    exposure_record(experiment, external_id="u", arm="candidate")

    arms = experiment_arms_of_logged(
        tenant,
        [("tab", "u"), (tab_v1.vllm_name, "u"), ("", "u"), ("gpt-4o", "u"), ("chat", "u"), (chat_v1.vllm_name, "u")],
    )
    mine = (experiment.pk, "candidate")
    assert arms == [mine, mine, mine, mine, None, None]  # another adapter's rows are in no experiment
