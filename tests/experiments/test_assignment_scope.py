"""The assignment endpoint records consent, so it needs a key that may write consent."""

from __future__ import annotations

import pytest

from apps.adapters.services import adapter_create, base_model_register
from apps.cohorts.models import ConsentChange, EndUser
from apps.experiments.models import ExperimentExposure

pytestmark = pytest.mark.django_db

URL = "/v1/adapters/autocomplete/assignment?user=dev-1&opted_in=true"


@pytest.fixture
def adapter(tenant, tiny_starter_model):
    base = base_model_register(name="starter-tiny", path=tiny_starter_model)
    return adapter_create(tenant, name="autocomplete", base_model=base, is_default=True)


@pytest.mark.parametrize("scopes", [["feedback"], ["admin"], ["feedback", "admin"]])
def test_a_key_that_may_not_write_consent_is_refused_and_nothing_is_recorded(adapter, make_client, scopes):
    client = make_client(adapter.tenant, scopes=scopes)
    response = client.get(URL)
    assert response.status_code == 403
    assert "'serve' or 'ingest'" in response.json()["error"]["message"]
    assert not EndUser.objects.exists()
    assert not ConsentChange.objects.exists()
    assert not ExperimentExposure.objects.exists()


@pytest.mark.parametrize("scope", ["serve", "ingest"])
def test_a_serve_or_ingest_key_gets_the_assignment_and_records_the_consent(adapter, make_client, scope):
    client = make_client(adapter.tenant, scopes=[scope])
    response = client.get(URL)
    assert response.status_code == 200
    assert (response.json()["user"], response.json()["opted_in"]) == ("dev-1", True)
    assert EndUser.objects.get(tenant=adapter.tenant, external_id="dev-1").opted_in is True
