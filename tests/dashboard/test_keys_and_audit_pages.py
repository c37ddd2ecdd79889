"""The API keys page offers a key's consent default and lists it; the audit log lists nothing while
a filter is invalid (as the interactions page does)."""

from __future__ import annotations

import pytest

from apps.tenants.models import ApiKey
from apps.tenants.services import api_key_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client, make_tenant, make_user):
    tenant = make_tenant("keys-page")
    client.force_login(make_user("ada", tenant, role="admin"))
    client.tenant = tenant
    return client


def test_the_keys_page_offers_the_consent_of_new_end_users_with_its_three_choices(admin_client):
    html = admin_client.get(f"/dashboard/t/{admin_client.tenant.slug}/keys/").content.decode()
    assert '<select name="default_opt_in"' in html
    for value, label in (("", "The tenant&#x27;s default"), ("true", "Opted in"), ("false", "Opted out")):
        assert f'<option value="{value}"' in html and label in html


@pytest.mark.parametrize(("posted", "stored"), [("true", True), ("false", False), ("", None)])
def test_a_key_made_on_the_page_keeps_the_consent_default_chosen(admin_client, posted, stored):
    tenant = admin_client.tenant
    response = admin_client.post(
        f"/dashboard/t/{tenant.slug}/keys/", {"name": "plugin", "scopes": ["editor"], "default_opt_in": posted}
    )
    assert response.status_code == 201
    assert ApiKey.objects.get(tenant=tenant, name="plugin").default_opt_in is stored


def test_the_keys_list_shows_each_keys_consent_default(admin_client):
    tenant = admin_client.tenant
    for name, default in (("in-key", True), ("out-key", False), ("inherits-key", None)):
        api_key_create(tenant, name=name, scopes=["editor"], default_opt_in=default)
    html = admin_client.get(f"/dashboard/t/{tenant.slug}/keys/").content.decode()
    rows = {
        name: html[html.index(f'title="{name}"') :].split("</tr>", 1)[0]
        for name in ("in-key", "out-key", "inherits-key")
    }
    assert "opted in" in rows["in-key"]
    assert "opted out" in rows["out-key"]
    assert "the tenant's default (opted out)" in rows["inherits-key"]  # the tenant opts no one in


@pytest.mark.parametrize("query", [{"actor": "x" * 201}, {"action": "bogus"}])
def test_an_invalid_audit_filter_shows_its_error_and_lists_no_event(admin_client, query):
    tenant = admin_client.tenant
    api_key_create(tenant, name="listed", scopes=["ingest"], actor="system")
    url = f"/dashboard/t/{tenant.slug}/audit/"
    assert admin_client.get(url).context["page"].object_list  # unfiltered: events are listed

    response = admin_client.get(url, query)

    assert response.status_code == 200
    assert response.context["form"].errors
    assert list(response.context["page"].object_list) == []
    assert "A filter is invalid" in response.content.decode()
