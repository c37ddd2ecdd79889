"""PATCH /v1/tenant changes what it names, audited; a body naming nothing changes nothing."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.tenants.models import AuditEvent, Tenant

pytestmark = pytest.mark.django_db


def test_an_empty_patch_writes_nothing_and_answers_the_current_settings(client_a):
    tenant = client_a.tenant
    client_a.get("/v1/tenant")  # the key's last use is recorded now, not during the PATCH below
    # Changed since the request's copy of the tenant was loaded: an empty PATCH must not write it back.
    Tenant.objects.filter(pk=tenant.pk).update(default_opt_in=True, retention_days=30)

    with CaptureQueriesContext(connection) as queries:
        response = client_a.patch("/v1/tenant", {}, format="json")

    assert response.status_code == 200
    assert response.json()["default_opt_in"] is True and response.json()["retention_days"] == 30
    assert not [q["sql"] for q in queries if q["sql"].startswith(("UPDATE", "INSERT"))]
    assert not AuditEvent.objects.filter(tenant=tenant, action="tenant.settings").exists()
    stored = Tenant.objects.get(pk=tenant.pk)
    assert (stored.default_opt_in, stored.retention_days) == (True, 30)


def test_a_patch_writes_only_what_it_names_with_its_audit_row(client_a):
    tenant = client_a.tenant
    Tenant.objects.filter(pk=tenant.pk).update(retention_days=30)

    response = client_a.patch("/v1/tenant", {"experiment_auto_promote": True}, format="json")

    assert response.status_code == 200 and response.json()["experiment_auto_promote"] is True
    stored = Tenant.objects.get(pk=tenant.pk)
    assert (stored.experiment_auto_promote, stored.retention_days) == (True, 30)
    audit = AuditEvent.objects.get(tenant=tenant, action="tenant.settings")
    assert audit.data == {"before": {"experiment_auto_promote": False}, "after": {"experiment_auto_promote": True}}
