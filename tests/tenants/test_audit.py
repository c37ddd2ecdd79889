"""The audit log takes every target a state change names, however long Strop lets it be."""

from __future__ import annotations

import pytest

from apps.adapters.models import AdapterVersion
from apps.tenants.models import AuditEvent
from apps.tenants.services import audit_record

pytestmark = pytest.mark.django_db


def test_an_audit_row_names_the_longest_adapter_version_name_a_tenant_can_have(make_tenant):
    tenant = make_tenant("t" * 64)  # the longest slug
    # An adapter version's vLLM name: "<tenant slug>--<adapter name>--v<n>-<8 hex>", up to its column's size.
    target = f"{tenant.slug}--{'a' * 64}--v12345-0123abcd".ljust(
        AdapterVersion._meta.get_field("vllm_name").max_length, "x"
    )
    assert len(target) >= 150

    audit_record(tenant, actor="system", action="adapter.version", target_type="adapter_version", target_id=target)

    assert AuditEvent.objects.get(tenant=tenant, action="adapter.version").target_id == target
