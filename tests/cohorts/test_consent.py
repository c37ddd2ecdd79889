"""Consent: what a request's flag means, the history, and the one rule training obeys."""

from __future__ import annotations

import pytest

from apps.cohorts.models import ConsentChange, EndUser
from apps.interactions.models import Interaction
from apps.training.selectors import training_events_eligible

pytestmark = pytest.mark.django_db


def log(client, n, user, **extra):
    body = {"client_id": f"c-{n}", "prompt": "x = ", "completion": "1", "end_user_id": user, **extra}
    response = client.post("/v1/interactions", body, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


def test_a_requests_flag_states_consent_now_and_its_absence_keeps_it(client_a):
    log(client_a, 1, "dev-1", opted_in=True)
    log(client_a, 2, "dev-1")  # no flag: still opted in
    log(client_a, 3, "dev-1", opted_in=False)
    log(client_a, 4, "dev-1")
    flags = list(Interaction.objects.order_by("client_id").values_list("end_user_opted_in", flat=True))
    assert flags == [True, True, False, False]
    user = EndUser.objects.get(external_id="dev-1")
    assert user.opted_in is False
    history = list(user.consent_history.order_by("changed_at", "id").values_list("opted_in", "source"))
    assert history == [(True, "request"), (False, "request")]


def test_new_users_take_the_keys_default_else_the_tenants(tenant, make_client):
    plain = make_client(tenant, scopes=["ingest"])
    log(plain, 1, "u-plain")
    assert EndUser.objects.get(external_id="u-plain").opted_in is False
    from apps.tenants.services import api_key_create

    issued = api_key_create(tenant, name="editor", scopes=["ingest"], default_opt_in=True)
    from rest_framework.test import APIClient

    editor = APIClient()
    editor.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.raw_key}")
    log(editor, 2, "u-editor")
    user = EndUser.objects.get(external_id="u-editor")
    assert user.opted_in is True
    assert list(user.consent_history.values_list("source", flat=True)) == ["default"]
    tenant.default_opt_in = True
    tenant.save()
    log(plain, 3, "u-tenant-default")
    assert EndUser.objects.get(external_id="u-tenant-default").opted_in is True


def test_an_event_trains_only_if_opted_in_then_and_still_now(client_a, tenant):
    from apps.adapters.models import Adapter, BaseModel

    base = BaseModel.objects.create(name="consent-base", path="/nonexistent", family="qwen")
    adapter = Adapter.objects.create(tenant=tenant, name="tab", base_model=base, is_default=True)
    then_and_now = log(client_a, 1, "stays", opted_in=True)
    not_then = log(client_a, 2, "joins", opted_in=False)
    log(client_a, 3, "joins", opted_in=True)  # opting in later does not resurrect event 2
    withdrawn = log(client_a, 4, "leaves", opted_in=True)
    for interaction_id in (then_and_now, not_then, withdrawn):
        client_a.post("/v1/feedback", {"interaction_id": interaction_id, "outcome": "accepted"}, format="json")
    client_a.post("/v1/feedback", {"client_id": "c-3", "outcome": "accepted"}, format="json")

    def eligible():
        return {str(i) for i in training_events_eligible(adapter, parent=None).values_list("interaction_id", flat=True)}

    assert eligible() == {then_and_now, withdrawn, Interaction.objects.get(client_id="c-3").pk.__str__()}
    assert client_a.post("/v1/users/leaves/opt-out").status_code == 200
    assert withdrawn not in eligible() and then_and_now in eligible()


def test_an_empty_user_never_consents(client_a):
    log(client_a, 1, "", opted_in=True)
    assert Interaction.objects.get().end_user_opted_in is False
    assert not EndUser.objects.exists() and not ConsentChange.objects.exists()
