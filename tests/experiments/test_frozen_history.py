"""Each exposed user's pre-exposure behaviour is frozen on their exposure row: later production
traffic, late feedback and retention deleting the pre-period leave their covariates as they were."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.cohorts.models import EndUser
from apps.experiments.arm_data import experiment_arm_data
from apps.experiments.history import history_freeze
from apps.experiments.models import Experiment, ExperimentExposure
from apps.experiments.services import exposure_record
from apps.interactions.models import Feedback, Interaction
from apps.privacy.retention import retention_prune
from tests.fixtures.interactions import interaction_with_feedback

pytestmark = pytest.mark.django_db


@pytest.fixture
def experiment(tenant, make_running_experiment):
    return make_running_experiment(tenant, "tab", is_default=True)


def production(tenant, user: str, *, at, outcome: str | None) -> Interaction:
    return interaction_with_feedback(tenant, user, at=at, outcome=outcome, source="logged")


def covariates_of(experiment: Experiment, user: str) -> list[float]:
    control, candidate = experiment_arm_data(experiment)
    exposure = ExperimentExposure.objects.get(experiment=experiment, end_user__external_id=user)
    arm = control if exposure.arm == "control" else candidate
    ids = list(
        ExperimentExposure.objects.filter(experiment=experiment, arm=exposure.arm)
        .order_by("id")  # an arm's users are in the order of their exposures' ids
        .values_list("end_user__external_id", flat=True)
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


def test_a_snapshot_freezes_many_users_each_up_to_their_own_exposure(tenant, experiment) -> None:
    now = timezone.now()
    early = EndUser.objects.create(tenant=tenant, external_id="early", opted_in=True)
    later = EndUser.objects.create(tenant=tenant, external_id="later", opted_in=True)
    for user in ("early", "later"):
        production(tenant, user, at=now - timedelta(days=2), outcome="accepted")
        production(tenant, user, at=now - timedelta(hours=3), outcome="rejected")  # between the two exposures
    for user, at in ((early, now - timedelta(days=1)), (later, now)):
        ExperimentExposure.objects.create(  # as recorded before the columns: the snapshot freezes both at once
            tenant=tenant, experiment=experiment, end_user=user, arm="control", first_exposed_at=at
        )
    assert history_freeze(experiment) == 2
    rows = ExperimentExposure.objects.filter(experiment=experiment)
    sums = dict(rows.values_list("end_user__external_id", "history_requests"))
    assert sums == {"early": 1, "later": 2}


def test_a_failed_freeze_at_exposure_still_records_the_exposure(tenant, experiment, monkeypatch) -> None:
    """The serving path records the exposure whatever the freeze does; the next snapshot freezes it."""
    from django.db import DatabaseError

    from apps.experiments.services import exposures

    def broken(*args, **kwargs):
        raise DatabaseError("canceling statement due to statement timeout")

    EndUser.objects.create(tenant=tenant, external_id="unlucky", opted_in=True)
    production(tenant, "unlucky", at=timezone.now() - timedelta(days=1), outcome="accepted")
    monkeypatch.setattr(exposures, "history_freeze", broken)
    exposure_record(experiment, external_id="unlucky", arm="candidate")
    row = ExperimentExposure.objects.get(experiment=experiment, end_user__external_id="unlucky")
    assert row.history_frozen_at is None
    monkeypatch.undo()
    covariates_of(experiment, "unlucky")  # a snapshot
    row.refresh_from_db()
    assert row.history_frozen_at is not None and row.history_requests == 1
