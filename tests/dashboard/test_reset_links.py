"""A password-reset link is bound to what it was issued under (issue 40): it dies when the account's
roles or tenants change, or its issuer's; a handed-over link is checked again against the Team
page's rules when it is used, and lives STROP_ADMIN_RESET_LINK_TTL_S; "Forgot your password?" is
throttled per e-mail address and per client, answering the same either way.

Every step goes through the pages, signed in with the real login form (Django's test client)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.core import mail
from django.core.cache import cache
from django.test import Client
from django.urls import reverse

from apps.tenants.models import Membership
from apps.tenants.reset_tokens import handed_over_tokens
from apps.tenants.team import invitation_create
from tests.dashboard.conftest import PASSWORD

pytestmark = pytest.mark.django_db

NEW_PASSWORD = "a-long-and-fresh-passphrase-42"


@pytest.fixture(autouse=True)
def _no_reset_requests_counted_yet() -> None:
    """The throttle's counters live in Redis, which outlives a test."""
    cache.clear()


@dataclass
class Team:
    a: Any
    b: Any
    owner: Any
    admin: Any
    viewer: Any
    b_owner: Any

    def member_url(self, name: str, user: Any) -> str:
        membership = Membership.objects.get(tenant=self.a, user=user)
        return reverse(f"dashboard:{name}", kwargs={"tenant_slug": self.a.slug, "membership_id": membership.pk})


@pytest.fixture
def team(make_tenant, make_user) -> Team:
    a, b = make_tenant("tenant-a"), make_tenant("tenant-b")
    viewer = make_user("vera", a, "viewer")
    viewer.email = "vera@example.com"
    viewer.save(update_fields=["email"])
    return Team(
        a=a,
        b=b,
        owner=make_user("olivia", a, "owner"),
        admin=make_user("adam", a, "admin"),
        viewer=viewer,
        b_owner=make_user("bob", b, "owner"),
    )


def _signed_in(user: Any, password: str = PASSWORD) -> Client:
    client = Client()
    response = client.post(reverse("dashboard:login"), {"username": user.get_username(), "password": password})
    assert response.status_code == 302, "the login form refused the test's own user"
    return client


def _signs_in(username: str, password: str) -> bool:
    return Client().post(reverse("dashboard:login"), {"username": username, "password": password}).status_code == 302


def _handed_link(team: Team, by: Any) -> str:
    response = _signed_in(by).post(team.member_url("member-password-reset", team.viewer))
    assert response.status_code == 201
    body = response.content.decode()
    assert "after 60 minutes" in body  # the page says how long the link lives
    return re.search(r'value="http://testserver(/dashboard/password/reset/[^"]+)"', body).group(1)


def _mailed_link(email: str = "vera@example.com") -> str:
    sent = len(mail.outbox)
    response = Client().post(reverse("dashboard:password-reset"), {"email": email})
    assert response.status_code == 302 and response["Location"] == reverse("dashboard:password-reset-done")
    assert len(mail.outbox) == sent + 1
    return re.search(r"http://testserver(/dashboard/password/reset/\S+/)", mail.outbox[-1].body).group(1)


def _opens_a_password_form(link: str) -> bool:
    page = Client().get(link, follow=True)
    return page.context["validlink"] is True


def _set_password(client: Client, link: str) -> Any:
    """Open ``link`` and post a new password on the form it leads to; the last response."""
    form = client.get(link, follow=True)
    target = form.redirect_chain[-1][0] if form.redirect_chain else link
    return client.post(target, {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD})


def _promote_viewer_to_owner(team: Team) -> None:
    response = _signed_in(team.owner).post(team.member_url("member-role", team.viewer), {"role": "owner"})
    assert response.status_code == 302


# A handed-over link dies when the account's standing changes


def test_an_admins_link_for_a_viewer_dies_when_the_viewer_is_made_owner(team):
    link = _handed_link(team, by=team.admin)
    assert _opens_a_password_form(link)

    _promote_viewer_to_owner(team)

    page = Client().get(link, follow=True)
    assert page.context["validlink"] is False and "This reset link is not valid" in page.content.decode()
    response = _set_password(Client(), link)
    assert response.context["validlink"] is False
    assert not _signs_in("vera", NEW_PASSWORD) and _signs_in("vera", PASSWORD)


def test_an_admins_link_for_a_viewer_dies_when_the_viewer_joins_another_tenant(team):
    viewer = _signed_in(team.viewer)  # before the link: signing in alone would end it (Django's own rule)
    link = _handed_link(team, by=team.admin)
    invitation = invitation_create(team.b, by=Membership.objects.get(tenant=team.b, user=team.b_owner), role="admin")
    joined = viewer.post(reverse("dashboard:invitation-accept", kwargs={"token": invitation.raw_token}))
    assert joined.status_code == 302 and Membership.objects.filter(tenant=team.b, user=team.viewer).exists()

    assert not _opens_a_password_form(link)
    _set_password(Client(), link)
    assert not _signs_in("vera", NEW_PASSWORD)


def test_a_link_opened_before_the_promotion_sets_no_password_after_it(team):
    """The attack in issue 40: open the link (its form comes up), wait for the promotion, then post."""
    holder = Client()
    form = holder.get(_handed_link(team, by=team.admin), follow=True)
    assert form.context["validlink"] is True
    set_password_url = form.redirect_chain[-1][0]

    _promote_viewer_to_owner(team)

    response = holder.post(set_password_url, {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD})
    assert response.status_code == 200 and response.context["validlink"] is False
    assert not _signs_in("vera", NEW_PASSWORD)


def test_a_link_dies_when_its_issuer_is_demoted(team):
    link = _handed_link(team, by=team.admin)
    response = _signed_in(team.owner).post(team.member_url("member-role", team.admin), {"role": "viewer"})
    assert response.status_code == 302

    assert not _opens_a_password_form(link)


def test_the_team_pages_refusal_rules_run_again_when_the_link_is_used(team):
    """Made staff after the link was made (an operator's change the token does not hash): the link
    shows why it is refused, never a password form."""
    link = _handed_link(team, by=team.admin)
    team.viewer.is_staff = True
    team.viewer.save(update_fields=["is_staff"])

    page = Client().get(link, follow=True)

    assert page.status_code == 403
    body = page.content.decode()
    assert "This reset link can no longer be used" in body and "staff account" in body
    assert "new_password1" not in body
    assert _set_password(Client(), link).status_code == 403
    assert not _signs_in("vera", NEW_PASSWORD)


def test_a_handed_over_link_works_for_an_hour_and_not_after(team, monkeypatch, settings):
    link = _handed_link(team, by=team.admin)
    ttl = settings.STROP_ADMIN_RESET_LINK_TTL_S
    assert ttl == 3600

    monkeypatch.setattr(handed_over_tokens, "_now", lambda: datetime.now() + timedelta(seconds=ttl - 60))
    assert _opens_a_password_form(link)

    monkeypatch.setattr(handed_over_tokens, "_now", lambda: datetime.now() + timedelta(seconds=ttl + 60))
    assert not _opens_a_password_form(link)
    _set_password(Client(), link)
    assert not _signs_in("vera", NEW_PASSWORD)


def test_a_handed_over_link_still_sets_the_password_when_nothing_changed(team):
    response = _set_password(Client(), _handed_link(team, by=team.admin))

    assert response.status_code == 302 and response["Location"] == reverse("dashboard:password-reset-complete")
    assert _signs_in("vera", NEW_PASSWORD)


# The mailed link, and its throttle


def test_a_mailed_link_dies_when_the_accounts_role_changes(team):
    link = _mailed_link()
    assert _opens_a_password_form(link)

    _promote_viewer_to_owner(team)

    assert not _opens_a_password_form(link)


def test_reset_mails_for_one_address_stop_at_the_limit_and_the_page_says_the_same(team, settings):
    limit = settings.STROP_PASSWORD_RESET_MAILS_PER_ACCOUNT
    answers = set()
    for n in range(limit + 3):
        response = Client().post(
            reverse("dashboard:password-reset"), {"email": "Vera@example.com"}, REMOTE_ADDR=f"198.51.100.{n}"
        )
        answers.add((response.status_code, response["Location"]))

    assert len(mail.outbox) == limit
    assert answers == {(302, reverse("dashboard:password-reset-done"))}


def test_reset_requests_from_one_client_stop_at_the_limit_and_other_clients_still_get_mail(make_user, settings):
    limit = settings.STROP_PASSWORD_RESET_REQUESTS_PER_CLIENT
    for n in range(limit + 2):
        user = make_user(f"user-{n}")
        user.email = f"user-{n}@example.com"
        user.save(update_fields=["email"])
    client = Client()

    for n in range(limit + 2):
        response = client.post(
            reverse("dashboard:password-reset"), {"email": f"user-{n}@example.com"}, REMOTE_ADDR="203.0.113.7"
        )
        assert response.status_code == 302

    assert len(mail.outbox) == limit
    client.post(reverse("dashboard:password-reset"), {"email": f"user-{limit}@example.com"}, REMOTE_ADDR="192.0.2.1")
    assert len(mail.outbox) == limit + 1


# A link whose issuer id no database column can hold (13 base-36 digits reach 36**13 > 2**63)

BEYOND_ANY_ID = "zzzzzzzzzzzzz"


def test_a_link_naming_an_issuer_id_beyond_any_column_is_an_invalid_link(team):
    from django.utils.encoding import force_bytes
    from django.utils.http import urlsafe_base64_encode

    uidb64 = urlsafe_base64_encode(force_bytes(team.viewer.pk))
    for issuer in (BEYOND_ANY_ID, "1y2p0ij32e8e8"):  # 36**13 - 1, and 2**63 itself
        page = Client().get(f"/dashboard/password/reset/{uidb64}/{issuer}-1-x/", follow=True)
        assert page.status_code == 200 and page.context["validlink"] is False
        assert "This reset link is not valid" in page.content.decode()


SQLITE_RESET_LINK = """
from django.contrib.auth import get_user_model
from django.test import Client
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode
user = get_user_model().objects.create_user(username="vera", password="a-long-and-fresh-passphrase-42")
uidb64 = urlsafe_base64_encode(force_bytes(user.pk))
page = Client().get(f"/dashboard/password/reset/{uidb64}/%s-1-x/", follow=True)
print("status", page.status_code, "invalid" if "This reset link is not valid" in page.content.decode() else "?")
"""


def test_on_the_embedded_sqlite_a_link_naming_an_issuer_id_beyond_any_column_is_an_invalid_link(tmp_path):
    import os
    import subprocess
    import sys

    from django.conf import settings

    env = {**os.environ, "DEBUG": "1", "DATABASE_URL": f"sqlite:///{tmp_path / 'embedded.sqlite3'}"}

    def manage(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args],
            cwd=settings.BASE_DIR,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    manage("migrate", "-v0")
    assert "status 200 invalid" in manage("shell", "-c", SQLITE_RESET_LINK % BEYOND_ANY_ID)
