"""The ingest benchmark's baseline: a bare view doing the same feedback upsert as Strop. It must
keep importing and writing as the upsert changes (it once broke silently, and the benchmark with it)."""

from __future__ import annotations

import orjson
import pytest
from django.test import RequestFactory

from apps.interactions.models import Feedback

pytestmark = pytest.mark.django_db


def test_the_bare_view_writes_the_same_pending_feedback_row(tenant, monkeypatch):
    from benchmarks import bare_urls

    monkeypatch.setattr(bare_urls, "_TENANT_ID", tenant.pk)
    body = orjson.dumps({"client_id": "b-1", "outcome": "accepted"})
    for _ in range(2):
        request = RequestFactory().post("/bench/bare-feedback", body, content_type="application/json")
        assert bare_urls.bare_feedback(request).status_code == 200
    row = Feedback.objects.get(tenant=tenant)
    assert (row.pending_client_id, row.outcome, row.events_received) == ("bare-b-1", "accepted", 2)
