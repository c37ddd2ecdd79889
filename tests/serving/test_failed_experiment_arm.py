"""An experiment arm whose version failed (vLLM refused it, at a load or a reload after a restart)
is never routed to: its users are served by production, counted in neither arm, and the experiment
is stopped with vLLM's reason, instead of answering them 404 ``model_not_loaded`` for as long as it
runs, errors no guardrail counts. The upstream knows the base model and production only, as a vLLM
that refused the candidate does."""

from __future__ import annotations

import pytest
from django.utils import timezone

from apps.adapters.models import Adapter, AdapterVersion, BaseModel
from apps.adapters.services import adapter_version_mark_failed
from apps.experiments.assignment import CANDIDATE, assign_arm
from apps.experiments.models import Experiment, ExperimentExposure
from apps.interactions.models import Interaction, ServingFailure
from apps.tenants.models import AuditEvent
from tests.serving.scripted_vllm import completion_answer, vllm_error

pytestmark = pytest.mark.django_db

REFUSAL = "Loading lora t--tab--v2 failed: rank 32 is greater than max_lora_rank 16"


@pytest.fixture
def running(make_tenant, make_client, scripted_vllm):
    """A running experiment of version 2 (loaded, in the experiment) against production version 1,
    a serve key of its tenant, and an end user the candidate arm serves."""
    tenant = make_tenant("arms")
    base = BaseModel.objects.create(name="m", path="/nonexistent", family="qwen")
    adapter = Adapter.objects.create(tenant=tenant, name="tab", base_model=base, is_default=True, holdout_share=0)
    now = timezone.now()
    v1, v2 = (
        AdapterVersion.objects.create(
            tenant=tenant, adapter=adapter, number=n, artifact_path=f"/x/v{n}", vllm_name=f"t--tab--v{n}",
            status=status, loaded_at=now,
        )
        for n, status in ((1, "production"), (2, "in_experiment"))
    )  # fmt: skip
    Adapter.objects.filter(pk=adapter.pk).update(production_version=v1)
    experiment = Experiment.objects.create(
        tenant=tenant, adapter=adapter, control_version=v1, candidate_version=v2, salt="s", status="running",
        started_at=now, created_by="test",
    )  # fmt: skip
    user = next(u for u in (f"dev-{i}" for i in range(100)) if assign_arm("s", u, candidate_weight=0.5) == CANDIDATE)

    def answer(path: str, body: dict) -> tuple[int, object]:
        if path == "/v1/load_lora_adapter":
            return vllm_error(500, REFUSAL, "InternalServerError")
        if body["model"] not in (base.name, v1.vllm_name):
            return vllm_error(404, f"The model `{body['model']}` does not exist.", "NotFoundError")
        return 200, completion_answer(body["model"], " return 1")

    scripted_vllm.script, scripted_vllm.models = answer, [base.name, v1.vllm_name]
    return experiment, make_client(tenant, scopes=["serve"]), user


def _complete(client, user: str):
    body = {"prompt": "def f(", "max_tokens": 4, "user": user, "opted_in": True}
    return client.post("/v1/completions", body, format="json")


def _served_by_production_outside_the_experiment(response, experiment: Experiment) -> None:
    assert response.status_code == 200, response.content
    assert response.json()["strop"]["version"] == experiment.control_version.vllm_name
    recorded = Interaction.objects.get(pk=response.json()["id"])
    assert recorded.adapter_version_id == experiment.control_version_id
    assert (recorded.experiment_id, recorded.experiment_arm) == (None, "")  # the experiment's data untouched


def test_an_arm_on_a_failed_version_is_served_by_production_and_its_experiment_stopped(running, scripted_vllm):
    experiment, client, user = running
    adapter_version_mark_failed(experiment.candidate_version, message=f"vLLM refused the adapter: {REFUSAL}")

    first = _complete(client, user)
    _served_by_production_outside_the_experiment(first, experiment)
    assert [body["model"] for _, body in scripted_vllm.asked] == ["t--tab--v1"]  # the failed one never asked
    experiment.refresh_from_db()
    assert experiment.status == Experiment.Status.STOPPED and experiment.ended_by == "system:serving"
    assert "candidate arm's version 2 failed" in experiment.decision_reason and REFUSAL in experiment.decision_reason
    stop = AuditEvent.objects.get(action="experiment.stop", target_id=str(experiment.pk))
    assert stop.actor == "system:serving" and REFUSAL in stop.data["reason"]
    assert not ExperimentExposure.objects.filter(experiment=experiment).exists()  # the user never met it
    assert experiment.candidate_version.status == AdapterVersion.Status.FAILED  # still failed, not a candidate

    _served_by_production_outside_the_experiment(_complete(client, user), experiment)  # and every request after


def test_a_version_that_fails_to_reload_mid_experiment_stops_it_and_the_next_request_is_served(running):
    """vLLM restarted and refuses the candidate now: the request that finds out gets vLLM's 404 (its
    version is gone), the version is marked failed and the experiment stopped at once."""
    experiment, client, user = running

    lost = _complete(client, user)
    assert lost.status_code == 404 and lost.json()["error"]["code"] == "model_not_loaded", lost.content
    experiment.refresh_from_db()
    experiment.candidate_version.refresh_from_db()
    assert experiment.candidate_version.status == AdapterVersion.Status.FAILED
    assert experiment.status == Experiment.Status.STOPPED and REFUSAL in experiment.decision_reason

    _served_by_production_outside_the_experiment(_complete(client, user), experiment)
    assert not ServingFailure.objects.exists()
