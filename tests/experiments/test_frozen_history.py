"""Each exposed user's pre-exposure behaviour is frozen on their exposure row: later production
traffic, late feedback and retention deleting the pre-period leave their covariates as they were."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.adapters.models import Adapter, AdapterVersion, BaseModel
from apps.cohorts.models import EndUser
from apps.experiments.arm_data import experiment_arm_data
from apps.experiments.history import history_freeze
from apps.experiments.models import Experiment, ExperimentExposure
from apps.experiments.services import exposure_record
from apps.interactions.models import Feedback, Interaction
from apps.privacy.retention import retention_prune

pytestmark = pytest.mark.django_db


@pytest.fixture
def experiment(tenant):
    base = BaseModel.objects.create(name="frozen-base", path="/nonexistent", family="qwen")
    adapter = Adapter.objects.create(tenant=tenant, name="tab", base_model=base, is_default=True)
    candidate = AdapterVersion.objects.create(
        tenant=tenant, adapter=adapter, number=1, artifact_path="/x", vllm_name="t--tab--v1", status="in_experiment"
    )
    return Experiment.objects.create(
        tenant=tenant,
        adapter=adapter,
        candidate_version=candidate,
        salt="s",
        status="running",
        started_at=timezone.now(),
        created_by="test",
    )


def production(tenant, user: str, *, at, outcome: str | None) -> Interaction:
    interaction = Interaction.objects.create(
        id=uuid.uuid4(),
        tenant=tenant,
        source="logged",
        prompt="p",
        completion="c",
        end_user_id=user,
        end_user_opted_in=True,
        served_at=at,
        received_at=at,
    )
    if outcome is not None:
        Feedback.objects.create(
            tenant=tenant, interaction=interaction, outcome=outcome, occurred_at=at, received_at=at, updated_at=at
        )
    return interaction


def covariates_of(experiment: Experiment, user: str) -> list[float]:
    control, candidate = experiment_arm_data(experiment)
    exposure = ExperimentExposure.objects.get(experiment=experiment, end_user__external_id=user)
    arm = control if exposure.arm == "control" else candidate
    ids = list(
        ExperimentExposure.objects.filter(experiment=experiment, arm=exposure.arm).values_list(
            "end_user__external_id", flat=True
        )
    )
    return arm.covariates[ids.index(user)].tolist()


def test_a_users_covariates_are_frozen_at_exposure(tenant, experiment) -> None:
    EndUser.objects.create(tenant=tenant, external_id="dev", opted_in=True)
    EndUser.objects.create(tenant=tenant, external_id="other", opted_in=True)
    now = timezone.now()
    for day, outcome in ((3, "accepted"), (2, "accepted"), (1, "rejected")):
        production(tenant, "dev", at=now - timedelta(days=day), outcome=outcome)
    late = production(tenant, "dev", at=now - timedelta(hours=5), outcome=None)  # no feedback yet
    production(tenant, "other", at=now - timedelta(days=1), outcome="rejected")
    exposure_record(experiment, external_id="dev", arm="control")
    exposure_record(experiment, external_id="other", arm="candidate")

    row = ExperimentExposure.objects.get(experiment=experiment, end_user__external_id="dev")
    assert row.history_frozen_at is not None
    assert (row.history_requests, row.history_shown, row.history_accepted) == (4, 3, 2)
    assert row.history_reward == pytest.approx(2 * 0.75 - 0.25)
    frozen = covariates_of(experiment, "dev")
    assert frozen[0] == pytest.approx((2 * 0.75 - 0.25) / 4) and frozen[1] == pytest.approx(2 / 3)

    # Later production traffic: a logged interaction from before the exposure ingested now, and
    # late feedback on a pre-period suggestion. Neither moves the frozen covariates.
    production(tenant, "dev", at=now - timedelta(days=2), outcome="accepted")
    Feedback.objects.create(
        tenant=tenant, interaction=late, outcome="accepted", occurred_at=now, received_at=now, updated_at=now
    )
    assert covariates_of(experiment, "dev") == frozen

    # Retention deletes every pre-period interaction: the stored sums stay.
    tenant.retention_days = 1
    tenant.save(update_fields=["retention_days"])
    retention_prune(tenant, now=now + timedelta(days=30))
    assert not Interaction.objects.filter(tenant=tenant, end_user_id="dev").exists()
    assert covariates_of(experiment, "dev") == frozen


def test_an_exposure_recorded_before_the_columns_is_frozen_once_by_the_next_snapshot(tenant, experiment) -> None:
    user = EndUser.objects.create(tenant=tenant, external_id="old", opted_in=True)
    now = timezone.now()
    production(tenant, "old", at=now - timedelta(days=1), outcome="accepted")
    ExperimentExposure.objects.create(  # as recorded before this change: nothing frozen
        tenant=tenant, experiment=experiment, end_user=user, arm="candidate", first_exposed_at=now
    )
    first = covariates_of(experiment, "old")
    row = ExperimentExposure.objects.get(experiment=experiment, end_user=user)
    assert row.history_frozen_at is not None and row.history_requests == 1 and row.history_accepted == 1
    production(tenant, "old", at=now - timedelta(hours=1), outcome="rejected")
    assert history_freeze(experiment) == 0  # frozen once, never again
    assert covariates_of(experiment, "old") == first


def test_a_user_without_production_history_is_frozen_with_zero_sums(tenant, experiment) -> None:
    EndUser.objects.create(tenant=tenant, external_id="new", opted_in=True)
    exposure_record(experiment, external_id="new", arm="control")
    row = ExperimentExposure.objects.get(experiment=experiment, end_user__external_id="new")
    assert row.history_frozen_at is not None
    assert (row.history_requests, row.history_shown, row.history_accepted, row.history_reward) == (0, 0, 0, 0.0)
    assert covariates_of(experiment, "new")[-1] == 0.0  # no history
