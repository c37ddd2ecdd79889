"""The process remembers the exposures it recorded, so a returning user costs serving no query; what
it remembers must never hide an exposure that is not there: one rolled back, or one an erase took
with its user."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from apps.cohorts.models import EndUser
from apps.experiments.models import ExperimentExposure
from apps.experiments.services import exposure_record
from apps.experiments.services import exposures as exposure_service
from apps.privacy.services import end_user_erase
from apps.serving.assignment import serving_assignment

pytestmark = pytest.mark.django_db


@pytest.fixture
def experiment(tenant, make_running_experiment, monkeypatch):
    monkeypatch.setattr(exposure_service, "_exposed", {})  # this test's process memory alone
    return make_running_experiment(tenant, "tab", is_default=True)


def _exposed(experiment, user: str) -> bool:
    return ExperimentExposure.objects.filter(experiment=experiment, end_user__external_id=user).exists()


def _serve(tenant, user: str):
    """What serving does for an opted-in user of the running experiment (the assignment endpoint's
    path: the end user read with the request, consent, the arm, the exposure), committed."""
    return serving_assignment(tenant, adapter_name="tab", user=user, flag=True, api_key=None, actor="test")


def test_a_user_erased_and_served_again_is_exposed_again(tenant, experiment, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        first = _serve(tenant, "dev")
    with django_capture_on_commit_callbacks(execute=True):
        assert _serve(tenant, "dev").arm == first.arm  # the user is stored now, and remembered
    assert first.experiment == experiment.pk and _exposed(experiment, "dev")
    assert exposure_service._exposed, "the recorded exposure is remembered once committed"

    end_user_erase(tenant, external_id="dev", actor="test")
    assert not _exposed(experiment, "dev") and not EndUser.objects.filter(external_id="dev").exists()

    with django_capture_on_commit_callbacks(execute=True):
        again = _serve(tenant, "dev")
    assert again.arm == first.arm  # the arm is the user's hash: it never moves
    assert _exposed(experiment, "dev"), "the user is back in the experiment, so their exposure must be too"


def test_an_exposure_rolled_back_is_not_remembered(tenant, experiment, django_capture_on_commit_callbacks):
    EndUser.objects.create(tenant=tenant, external_id="dev", opted_in=True)
    with pytest.raises(RuntimeError), transaction.atomic():
        exposure_record(experiment, external_id="dev", arm="control")
        raise RuntimeError("the request failed after routing")
    assert not _exposed(experiment, "dev")
    with django_capture_on_commit_callbacks(execute=True):
        exposure_record(experiment, external_id="dev", arm="control")
    assert _exposed(experiment, "dev")


def test_a_remembered_exposure_costs_no_query(tenant, experiment, django_capture_on_commit_callbacks):
    user = EndUser.objects.create(tenant=tenant, external_id="dev", opted_in=True)
    with django_capture_on_commit_callbacks(execute=True):
        exposure_record(experiment, external_id="dev", arm="control", end_user_id=user.pk)
    with django_capture_on_commit_callbacks(execute=True) as callbacks, CaptureQueriesContext(connection) as queries:
        exposure_record(experiment, external_id="dev", arm="control", end_user_id=user.pk)
    assert len(queries) == 0 and not callbacks
    assert ExperimentExposure.objects.filter(experiment=experiment).count() == 1


@pytest.mark.django_db(transaction=True)  # committed as serving commits: the foreign key is checked then
def test_a_user_erased_after_the_request_read_them_is_not_exposed_and_the_request_goes_on(tenant, experiment):
    read = EndUser.objects.create(tenant=tenant, external_id="dev", opted_in=True).pk  # what the request read
    end_user_erase(tenant, external_id="dev", actor="test")  # meanwhile

    exposure_record(experiment, external_id="dev", arm="control", end_user_id=read)  # no IntegrityError

    assert not ExperimentExposure.objects.filter(experiment=experiment).exists()
    assert not exposure_service._exposed
