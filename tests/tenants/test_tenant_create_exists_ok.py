"""``manage.py tenant_create --exists-ok`` is safe to run again (a setup script's every start):
whether the slug was given or made from the name, a tenant that exists is left alone, with no
second key."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command

from apps.tenants.models import ApiKey, AuditEvent, Tenant

pytestmark = pytest.mark.django_db


def _create(*args: str) -> str:
    out = io.StringIO()
    call_command("tenant_create", *args, stdout=out)
    return out.getvalue()


def test_exists_ok_twice_with_a_slug_made_from_the_name_creates_one_tenant_and_one_key():
    assert "tenant: acme-corp" in _create("Acme Corp", "--exists-ok")
    assert _create("Acme Corp", "--exists-ok") == ""
    assert Tenant.objects.get().slug == "acme-corp"
    assert ApiKey.objects.count() == 1
    assert AuditEvent.objects.filter(action="tenant.create").count() == 1


def test_exists_ok_with_a_given_slug_still_leaves_the_tenant_alone():
    _create("Acme", "--slug", "acme")
    assert _create("Acme again", "--slug", "acme", "--exists-ok", "--key-only") == ""
    assert Tenant.objects.get().name == "Acme" and ApiKey.objects.count() == 1


def test_without_exists_ok_a_taken_slug_made_from_the_name_is_still_refused():
    _create("Acme Corp")
    with pytest.raises(CommandError, match="'acme-corp' already exists"):
        _create("Acme Corp")
    assert ApiKey.objects.count() == 1
