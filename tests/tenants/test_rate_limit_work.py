"""Rate limits count work: a batch call costs one unit of the tenant's per-minute limit per
STROP_RATE_LIMIT_ITEMS_PER_UNIT items (here mostly 1, so that small batches show it)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from apps.cohorts.models import EndUser
from apps.interactions.models import Interaction
from apps.tenants import ratelimit

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _one_unit_per_item(settings) -> None:
    settings.STROP_RATE_LIMIT_ITEMS_PER_UNIT = 1


@pytest.fixture(autouse=True)
def _fresh_window() -> None:
    """Counts are per minute: a test that would straddle two windows waits for the next one."""
    if time.time() % ratelimit.WINDOW_S > ratelimit.WINDOW_S - 10:
        time.sleep(ratelimit.WINDOW_S - time.time() % ratelimit.WINDOW_S + 0.1)


def _interaction(i: int) -> dict[str, Any]:
    return {"client_id": f"c-{i}", "prompt": f"x{i} = ", "completion": "1", "end_user_id": "dev-1", "opted_in": True}


def _feedback(i: int) -> dict[str, Any]:
    return {"client_id": f"c-{i}", "outcome": "accepted"}


def _end_user(i: int) -> dict[str, Any]:
    return {"end_user_id": f"u-{i}", "opted_in": True}


BATCH_ENDPOINTS = [
    ("/v1/interactions", _interaction, lambda tenant: Interaction.objects.filter(tenant=tenant).count()),
    ("/v1/feedback", _feedback, None),
    ("/v1/users/import", _end_user, lambda tenant: EndUser.objects.filter(tenant=tenant).count()),
]


@pytest.mark.parametrize("path, item, stored", BATCH_ENDPOINTS, ids=[p for p, _, _ in BATCH_ENDPOINTS])
def test_a_batch_of_n_items_costs_n_units_and_the_batch_that_crosses_the_limit_is_refused(
    make_tenant, make_client, path: str, item: Callable[[int], dict], stored: Callable | None
):
    tenant = make_tenant("batcher", rate_limit_per_minute=10)
    client = make_client(tenant)
    batches = [[item(4 * b + i) for i in range(4)] for b in range(3)]
    assert client.post(path, {"items": batches[0]}, format="json").status_code == 207  # 4 of 10
    assert client.post(path, {"items": batches[1]}, format="json").status_code == 207  # 8 of 10
    before = stored(tenant) if stored else None

    refused = client.post(path, {"items": batches[2]}, format="json")  # 12 of 10: refused whole

    assert refused.status_code == 429, refused.content
    assert 1 <= int(refused["Retry-After"]) <= 60
    error = refused.json()["error"]
    assert error["code"] == "rate_limited"
    assert "limit of 10 requests per minute" in error["message"]
    assert "batch of 4 items costs 4 (one per item)" in error["message"]
    assert error["details"]["limit_per_minute"] == 10 and error["details"]["cost"] == 4
    if stored:
        assert stored(tenant) == before == 8  # the refused batch stored nothing
    # Its first unit was spent before its body was read: one single call is left, then none.
    assert [client.get("/v1/tenant").status_code for _ in range(2)] == [200, 429]


def test_a_single_item_costs_one_unit(make_tenant, make_client):
    tenant = make_tenant("single", rate_limit_per_minute=3)
    client = make_client(tenant)
    codes = [client.post("/v1/interactions", _interaction(i), format="json").status_code for i in range(4)]
    assert codes == [201, 201, 201, 429]


def test_a_batch_larger_than_the_whole_limit_is_refused_as_such(make_tenant, make_client):
    tenant = make_tenant("oversized", rate_limit_per_minute=5)
    client = make_client(tenant)
    response = client.post("/v1/interactions", {"items": [_interaction(i) for i in range(6)]}, format="json")
    assert response.status_code == 429
    assert "a batch of 6 items costs 6" in response.json()["error"]["message"]
    assert "send smaller batches" in response.json()["error"]["message"]
    assert not Interaction.objects.filter(tenant=tenant).exists()


def test_a_csv_import_costs_one_unit_per_row(make_tenant, make_client):
    tenant = make_tenant("csv", rate_limit_per_minute=5)
    client = make_client(tenant)
    rows = "end_user_id,opted_in\n" + "".join(f"u-{i},true\n" for i in range(6))
    response = client.post("/v1/users/import", rows, content_type="text/csv")
    assert response.status_code == 429 and "batch of 6 items" in response.json()["error"]["message"]
    assert not EndUser.objects.filter(tenant=tenant).exists()


def test_by_default_a_batch_costs_one_unit_per_twenty_items(settings, make_tenant, make_client):
    settings.STROP_RATE_LIMIT_ITEMS_PER_UNIT = 20
    tenant = make_tenant("by-twenty", rate_limit_per_minute=5)
    client = make_client(tenant)
    items = [_interaction(i) for i in range(41)]  # 3 units: 41 items, one unit per 20 started
    assert client.post("/v1/interactions", {"items": items}, format="json").status_code == 207  # 3 of 5
    refused = client.post("/v1/interactions", {"items": [_interaction(100 + i) for i in range(41)]}, format="json")
    assert refused.status_code == 429  # 6 of 5
    assert "this batch of 41 items costs 3 (one per 20 items)" in refused.json()["error"]["message"]
    assert refused.json()["error"]["details"]["cost"] == 3
    assert Interaction.objects.filter(tenant=tenant).count() == 41
