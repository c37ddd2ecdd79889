"""``manage.py tenant_create`` checks everything it was given before it writes anything, and says
what is wrong; a tenant and its first key are made together or not at all."""

from __future__ import annotations

import io

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from apps.common.exceptions import ValidationFailed
from apps.tenants.models import ApiKey, AuditEvent, Tenant
from apps.tenants.services import tenant_create

pytestmark = pytest.mark.django_db


def _create(*args: str) -> str:
    out = io.StringIO()
    call_command("tenant_create", *args, stdout=out)
    return out.getvalue()


def _nothing_stored() -> None:
    assert not Tenant.objects.exists()
    assert not ApiKey.objects.exists() and not AuditEvent.objects.exists()


def test_an_unknown_scope_creates_no_tenant_and_a_rerun_with_good_scopes_works():
    with pytest.raises(CommandError, match="^scopes: unknown scope\\(s\\) root"):
        _create("Acme", "--scopes", "ingest,root")
    _nothing_stored()

    assert "tenant: acme" in _create("Acme", "--scopes", "ingest")
    assert ApiKey.objects.get(tenant__slug="acme").scopes == ["ingest"]


@pytest.mark.parametrize("slug", ["acme.io", "acme corp", "acmé", "a/b", "x" * 65])
def test_a_slug_the_dashboards_urls_cannot_hold_is_refused_naming_it(slug):
    with pytest.raises(CommandError, match="^slug: "):
        _create("Acme", "--slug", slug)
    _nothing_stored()


@pytest.mark.parametrize("slug", ["_acme", "-acme"])
def test_a_slug_not_starting_with_a_letter_or_digit_is_refused_as_a_400_naming_it(slug):
    # Every version's vLLM name starts with the slug, and a replica fetching from object storage
    # takes only names that start with a letter or digit: such a tenant's versions could never load.
    with pytest.raises(CommandError, match=f"^slug: '{slug}' must start with a letter or digit"):
        _create("Acme", f"--slug={slug}")
    _nothing_stored()
    with pytest.raises(ValidationFailed, match="must start with a letter or digit") as refused:
        tenant_create(name="Acme", slug=slug)
    assert refused.value.status_code == 400
    _nothing_stored()


def test_every_slug_it_takes_makes_the_dashboards_urls():
    _create("Acme", "--slug", "Acme_2-x")
    _create("A" * 90)  # a slug from a long name is cut to the column's 64 characters
    for tenant in Tenant.objects.all():
        assert len(tenant.slug) <= 64
        assert reverse("dashboard:overview", kwargs={"tenant_slug": tenant.slug})


@pytest.mark.parametrize(("limit", "says"), [("-1", "at least 0"), ("2147483648", "at most 2147483647")])
def test_a_rate_limit_out_of_range_is_refused_as_such_not_as_a_slug_taken(limit, says):
    with pytest.raises(CommandError, match=f"^rate_limit_per_minute: .*{says}") as refused:
        _create("Acme", "--rate-limit", limit)
    assert "already exists" not in str(refused.value)
    _nothing_stored()


def test_a_name_longer_than_its_column_is_refused_naming_it():
    with pytest.raises(CommandError, match="^name: "):
        _create("N" * 201, "--slug", "long-name")
    _nothing_stored()


def test_a_slug_taken_is_still_said_so_and_changes_nothing():
    _create("Acme")
    with pytest.raises(CommandError, match="already exists"):
        _create("Acme", "--scopes", "serve")
    assert Tenant.objects.count() == 1 and ApiKey.objects.count() == 1
