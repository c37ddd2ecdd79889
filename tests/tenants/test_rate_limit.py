from __future__ import annotations

import pytest

pytestmark = pytest.mark.django_db


def test_tenant_over_its_limit_gets_429_with_retry_after(make_tenant, make_client):
    tenant = make_tenant("limited", rate_limit_per_minute=3)
    client = make_client(tenant)
    assert [client.get("/v1/tenant").status_code for _ in range(3)] == [200, 200, 200]
    response = client.get("/v1/tenant")
    assert response.status_code == 429
    assert 1 <= int(response["Retry-After"]) <= 60
    assert response.json()["error"]["code"] == "rate_limited"


def test_limits_are_per_tenant(make_tenant, make_client):
    busy = make_client(make_tenant("busy", rate_limit_per_minute=1))
    calm = make_client(make_tenant("calm", rate_limit_per_minute=1))
    assert busy.get("/v1/tenant").status_code == 200
    assert busy.get("/v1/tenant").status_code == 429
    assert calm.get("/v1/tenant").status_code == 200


def test_all_keys_of_a_tenant_share_one_budget(make_tenant, make_client):
    tenant = make_tenant("shared", rate_limit_per_minute=2)
    first, second = make_client(tenant), make_client(tenant)
    assert first.get("/v1/tenant").status_code == 200
    assert second.get("/v1/tenant").status_code == 200
    assert first.get("/v1/tenant").status_code == 429
