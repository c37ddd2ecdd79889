"""An end user's interactions are read by the ``(tenant, end_user_id, received_at)`` index: the
end-user page's latest 20 need not walk the tenant's history (4.0 s for a user with few interactions
in a 5,000,000-row tenant before it, 21 ms after: make bench-data), and the erase finds them by it."""

from __future__ import annotations

import pytest
from django.db import connection

from apps.cohorts.models import EndUser
from apps.interactions.models import Interaction
from apps.privacy.selectors import end_user_detail

pytestmark = pytest.mark.django_db


def test_a_users_latest_interactions_come_from_the_user_index(client_a):
    items = [{"client_id": f"c{i}", "prompt": "p", "completion": "c", "end_user_id": f"dev-{i % 3}"} for i in range(30)]
    response = client_a.post("/v1/interactions", {"items": items}, format="json")
    assert response.status_code == 207 and {r["status"] for r in response.json()["results"]} == {"created"}
    user = EndUser.objects.get(tenant=client_a.tenant, external_id="dev-1")
    detail = end_user_detail(client_a.tenant, end_user=user)
    assert detail["interactions"] == 10 and len(detail["recent_interactions"]) == 10
    latest = Interaction.objects.filter(tenant=client_a.tenant, end_user_id="dev-1").order_by("-received_at", "-id")
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")  # a test's table is small enough to read whole
    plan = latest[:20].explain()
    assert "interaction_tenant_user_recv" in plan, plan
