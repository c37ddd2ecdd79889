from __future__ import annotations

import io

import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from apps.tenants.keys import hash_key
from apps.tenants.models import ApiKey, AuditEvent

pytestmark = pytest.mark.django_db


def test_key_authenticates_and_only_its_hash_is_stored(client_a):
    response = client_a.get("/v1/tenant")
    assert response.status_code == 200
    assert response.json()["slug"] == "acme"
    stored = ApiKey.objects.get(tenant=client_a.tenant)
    assert client_a.raw_key not in (stored.key_hash, stored.prefix)
    assert stored.key_hash == hash_key(client_a.raw_key)
    secret = client_a.raw_key.split("_", 2)[2]  # the whole secret: it may hold "_" itself (URL-safe base64)
    assert len(secret) >= 32 and not ApiKey.objects.filter(key_hash__contains=secret).exists()


def test_created_key_is_shown_once_and_listing_never_shows_it(client_a):
    created = client_a.post("/v1/keys", {"name": "ci", "scopes": ["ingest"]}, format="json")
    assert created.status_code == 201
    raw = created.json()["key"]
    assert raw.startswith("strop_")
    listing = client_a.get("/v1/keys").json()
    assert all("key" not in row for row in listing)
    assert raw not in str(listing)
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    assert other.get("/v1/tenant").status_code == 200


def test_revoked_key_stops_working_and_the_revocation_is_audited(client_a):
    created = client_a.post("/v1/keys", {"name": "temp", "scopes": ["feedback"]}, format="json").json()
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {created['key']}")
    assert other.get("/v1/tenant").status_code == 200
    assert client_a.delete(f"/v1/keys/{created['id']}").status_code == 200
    response = other.get("/v1/tenant")
    assert response.status_code == 401
    assert response.json()["error"]["message"] == "this API key was revoked"
    actions = list(AuditEvent.objects.filter(tenant=client_a.tenant).values_list("action", flat=True))
    assert "api_key.create" in actions and "api_key.revoke" in actions


@pytest.mark.parametrize(
    "header",
    ["", "Bearer", "Token abc", "Bearer strop_000000000000_wrong", "Bearer not-a-key"],
)
def test_missing_or_wrong_key_is_401_with_the_error_shape(db, header):
    client = APIClient()
    if header:
        client.credentials(HTTP_AUTHORIZATION=header)
    response = client.get("/v1/tenant")
    assert response.status_code == 401
    assert set(response.json()["error"]) == {"message", "type", "param", "code", "details"}


def test_right_prefix_with_wrong_secret_is_refused(client_a):
    prefix = client_a.raw_key.split("_")[1]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer strop_{prefix}_forged-secret")
    assert client.get("/v1/tenant").status_code == 401


def test_key_without_the_scope_is_403_naming_the_scope(tenant, make_client):
    client = make_client(tenant, scopes=["feedback"])
    response = client.post("/v1/interactions", {"client_id": "x", "prompt": "a", "completion": "b"}, format="json")
    assert response.status_code == 403
    assert "'ingest' scope" in response.json()["error"]["message"]


def test_unknown_scope_is_a_400_naming_it(client_a):
    response = client_a.post("/v1/keys", {"name": "bad", "scopes": ["ingest", "root"]}, format="json")
    assert response.status_code == 400
    assert "root" in response.json()["error"]["message"]
    assert ApiKey.objects.filter(tenant=client_a.tenant).count() == 1


def test_last_used_time_is_recorded(client_a):
    assert ApiKey.objects.get(tenant=client_a.tenant).last_used_at is None
    client_a.get("/v1/tenant")
    assert ApiKey.objects.get(tenant=client_a.tenant).last_used_at is not None


def test_management_command_creates_a_tenant_and_a_working_key(db):
    out = io.StringIO()
    call_command("tenant_create", "Globex Corp", "--key-only", stdout=out)
    raw = out.getvalue().strip()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    body = client.get("/v1/tenant").json()
    assert body["slug"] == "globex-corp"
    assert body["key"]["scopes"] == ["ingest", "feedback", "serve", "admin"]


def test_management_command_refuses_a_duplicate_slug(db):
    call_command("tenant_create", "Initech", stdout=io.StringIO())
    with pytest.raises(Exception, match="already exists"):
        call_command("tenant_create", "Initech", stdout=io.StringIO())


def test_operator_can_issue_another_key_for_an_existing_tenant(tenant):
    out = io.StringIO()
    call_command("api_key_create", tenant.slug, "--scopes", "feedback", stdout=out)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {out.getvalue().strip()}")
    assert client.get("/v1/tenant").json()["key"]["scopes"] == ["feedback"]
    assert AuditEvent.objects.filter(tenant=tenant, action="api_key.create", actor="operator").exists()


def test_tenant_create_with_exists_ok_leaves_the_tenant_alone(tenant):
    call_command("tenant_create", "Other", "--slug", tenant.slug, "--exists-ok", stdout=io.StringIO())
    assert ApiKey.objects.filter(tenant=tenant).count() == 0


def test_the_key_lookup_reads_every_field_of_the_key_and_its_tenant_as_the_orm_does(make_tenant):
    from django.forms.models import model_to_dict

    from apps.tenants.selectors import api_key_find_with
    from apps.tenants.services import api_key_create, api_key_touch

    tenant = make_tenant("lookup")
    tenant.rate_limit_per_minute, tenant.accept_pending_feedback, tenant.default_opt_in = 77, False, True
    tenant.save()
    issued = api_key_create(tenant, name="ci", scopes=["ingest", "serve"], default_opt_in=False)
    key = ApiKey.objects.select_related("tenant").get(pk=issued.api_key.pk)
    api_key_touch(api_key=key, resolution_s=0)
    key.refresh_from_db()

    found = api_key_find_with(prefix=key.prefix, also=[])[0]
    assert model_to_dict(found) == model_to_dict(key)
    assert (found.created_at, found.last_used_at, found.revoked_at) == (key.created_at, key.last_used_at, None)
    assert found.scopes == ["ingest", "serve"] and found.default_opt_in is False
    assert model_to_dict(found.tenant) == model_to_dict(key.tenant)
    assert found.tenant.created_at == key.tenant.created_at and found.tenant.pk == tenant.pk
    assert found.tenant.rate_limit_per_minute == 77 and found.tenant.accept_pending_feedback is False
    assert api_key_find_with(prefix="nosuchprefix", also=[])[0] is None
