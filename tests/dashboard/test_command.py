from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.management import CommandError, call_command
from django.test import RequestFactory

from apps.tenants.models import AuditEvent, Membership

pytestmark = pytest.mark.django_db


def _sign_in(username: str, password: str):
    """authenticate() as the login page calls it: with a request, which django-axes needs."""
    return authenticate(RequestFactory().post("/dashboard/login/"), username=username, password=password)


def _run(*args: str) -> str:
    out = StringIO()
    call_command("dashboard_user_create", *args, stdout=out)
    return out.getvalue()


def test_creates_a_user_with_a_role_and_prints_the_generated_password(make_tenant):
    tenant = make_tenant("acme")
    out = _run("alice", "--tenant", "acme", "--role", "admin")
    password = out.split("password (shown once): ")[1].strip()
    user = _sign_in(username="alice", password=password)
    assert user is not None
    assert Membership.objects.get(user=user, tenant=tenant).role == "admin"
    assert AuditEvent.objects.filter(tenant=tenant, action="membership.create", target_id=str(user.pk)).exists()


def test_a_given_password_is_not_printed_and_an_existing_user_gets_the_role(make_tenant):
    make_tenant("acme")
    other = make_tenant("other")
    assert "password" not in _run("bob", "--tenant", "acme", "--password", "s3cret-enough")
    _run("bob", "--tenant", "other", "--role", "owner")
    user = _sign_in(username="bob", password="s3cret-enough")
    assert Membership.objects.get(user=user, tenant=other).role == "owner"


def test_an_unknown_tenant_is_an_error(db):
    with pytest.raises(CommandError, match="no tenant"):
        _run("carol", "--tenant", "nope")


def test_running_it_again_sets_the_password_and_keeps_the_membership(make_tenant):
    tenant = make_tenant("acme")
    _run("dana", "--tenant", "acme", "--role", "admin", "--password", "first-password-1")
    assert "is admin of acme" in _run("dana", "--tenant", "acme", "--role", "admin", "--password", "second-password-2")
    user = _sign_in(username="dana", password="second-password-2")
    assert user is not None
    assert Membership.objects.filter(user=user, tenant=tenant).count() == 1
    with pytest.raises(CommandError, match="already admin of acme"):
        _run("dana", "--tenant", "acme", "--role", "viewer")


@pytest.mark.parametrize(
    ("password", "reason"),
    [
        ("short-1", "too short"),
        ("password1234", "too common"),
        ("804512397716", "entirely numeric"),
        ("erin-the-operator", "too similar to the username"),
    ],
)
def test_a_weak_password_is_refused_with_the_reason_and_nothing_is_created(make_tenant, password, reason):
    tenant = make_tenant("acme")
    with pytest.raises(CommandError, match=f"password refused: .*{reason}"):
        _run("erin-the-operator", "--tenant", "acme", "--role", "admin", "--password", password)
    assert not Membership.objects.filter(tenant=tenant).exists()
    assert not get_user_model().objects.filter(username="erin-the-operator").exists()


def test_a_weak_new_password_for_an_existing_user_is_refused_and_the_old_one_still_works(make_tenant):
    make_tenant("acme")
    _run("fay", "--tenant", "acme", "--password", "first-password-1")
    with pytest.raises(CommandError, match="password refused: .*too short"):
        _run("fay", "--tenant", "acme", "--password", "fay")
    assert _sign_in("fay", "first-password-1") is not None
