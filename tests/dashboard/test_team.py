"""The Team page: invitations (hashed, single use, 7 days), roles, removal, the last owner, reset links,
and "Forgot your password?" (Django test client; the roles' walls on every route are test_walls.py's)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from apps.tenants.keys import hash_key
from apps.tenants.models import AuditEvent, Invitation, Membership
from apps.tenants.team import invitation_create
from tests.dashboard.conftest import PASSWORD

pytestmark = pytest.mark.django_db

NEW_PASSWORD = "a-long-and-fresh-passphrase-42"


@dataclass
class Team:
    a: Any
    b: Any
    owner: Any
    admin: Any
    viewer: Any
    outsider: Any

    def membership(self, user: Any, tenant: Any = None) -> Membership:
        return Membership.objects.get(tenant=tenant or self.a, user=user)

    def url(self, name: str, **kwargs: Any) -> str:
        return reverse(f"dashboard:{name}", kwargs={"tenant_slug": self.a.slug, **kwargs})

    def member_url(self, name: str, user: Any) -> str:
        return self.url(name, membership_id=self.membership(user).pk)


@pytest.fixture
def team(make_tenant, make_user) -> Team:
    a, b = make_tenant("tenant-a"), make_tenant("tenant-b")
    return Team(
        a=a,
        b=b,
        owner=make_user("olivia", a, "owner"),
        admin=make_user("adam", a, "admin"),
        viewer=make_user("vera", a, "viewer"),
        outsider=make_user("bob", b, "owner"),
    )


def _as(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _invite(team: Team, *, role: str = "viewer", by: Any = None, note: str = "dana@example.com") -> tuple[Any, str]:
    issued = invitation_create(team.a, by=team.membership(by or team.owner), role=role, note=note)
    return issued.invitation, issued.raw_token


def _accept_url(token: str) -> str:
    return reverse("dashboard:invitation-accept", kwargs={"token": token})


def _signup(username: str = "dana", password: str = NEW_PASSWORD, **extra: str) -> dict[str, str]:
    return {"username": username, "password1": password, "password2": password, **extra}


def _team_state(team: Team) -> tuple[Any, ...]:
    """Everything a team action could change."""
    return (
        sorted(Membership.objects.values_list("tenant_id", "user_id", "role")),
        sorted(Invitation.objects.values_list("pk", "used_at", "revoked_at")),
        get_user_model().objects.count(),
        AuditEvent.objects.count(),
    )


def _audit(team: Team, action: str) -> AuditEvent:
    return AuditEvent.objects.filter(tenant=team.a, action=action).latest("id")


# The page


def test_the_team_page_lists_members_with_role_and_since_and_pending_invitations(team):
    _invite(team, role="admin", note="carol from data")
    used, token = _invite(team, note="already used")
    Client().post(_accept_url(token), _signup("uma"))
    body = _as(team.viewer).get(team.url("team")).content.decode()
    for name, role in (("olivia", "owner"), ("adam", "admin"), ("vera", "viewer"), ("uma", "viewer")):
        assert re.search(rf'data-member="{name}".*?badge--role">{role}<', body, re.S), name
    assert "Member since" in body and team.membership(team.viewer).created_at.strftime("%Y-%m-%d") in body
    assert "carol from data" in body and "already used" not in body  # pending only
    assert "Invite a teammate" not in body and "Change role" not in body and "Revoke…" not in body


def test_an_admin_sees_actions_on_viewers_and_admins_but_none_on_owners(team):
    body = _as(team.admin).get(team.url("team")).content.decode()
    assert team.member_url("member-role", team.viewer) in body
    assert team.member_url("member-role", team.admin) in body
    assert team.member_url("member-role", team.owner) not in body
    assert team.member_url("member-remove", team.owner) not in body
    assert 'href="' + team.url("invitation-new") in body


def test_the_team_page_reads_in_as_many_queries_for_many_members_as_for_few(team, make_user):
    client = _as(team.viewer)
    _invite(team)
    few = _queries(client, team.url("team"))
    for i in range(5):
        make_user(f"extra-{i}", team.a, "viewer")
        _invite(team, note=f"invitee {i}")
    assert _queries(client, team.url("team")) == few


def _queries(client: Client, url: str) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as captured:
        assert client.get(url).status_code == 200
    return len(captured.captured_queries)


# Invitations: made, shown once, hashed


def test_an_owner_invites_an_owner_and_the_link_is_shown_once_with_only_its_hash_stored(team):
    client = _as(team.owner)
    assert client.get(team.url("invitation-new")).status_code == 200
    response = client.post(team.url("invitation-new"), {"role": "owner", "note": "dana@example.com"})
    assert response.status_code == 201 and response["Cache-Control"] == "no-store"
    shown = r'value="http://testserver/dashboard/invite/([A-Za-z0-9_-]+)/" readonly data-invitation-link'
    found = re.search(shown, response.content.decode())
    assert found is not None
    raw = found.group(1)
    assert len(raw) >= 40
    invitation = Invitation.objects.get(tenant=team.a)
    assert invitation.token_hash == hash_key(raw) and invitation.role == "owner"
    assert raw not in str(list(Invitation.objects.values().all()))
    assert raw not in str(list(AuditEvent.objects.values().all()))
    assert invitation.expires_at - timezone.now() > timedelta(days=6, hours=23)
    assert invitation.expires_at - timezone.now() <= timedelta(days=7)
    event = _audit(team, "invitation.create")
    assert event.actor == f"user:{team.owner.pk}" and event.data["role"] == "owner"
    assert raw not in client.get(team.url("team")).content.decode()


def test_an_admin_cannot_invite_an_owner_and_nothing_is_made(team):
    client = _as(team.admin)
    assert 'value="owner"' not in client.get(team.url("invitation-new")).content.decode()
    before = _team_state(team)
    response = client.post(team.url("invitation-new"), {"role": "owner"})
    assert response.status_code == 403 and "Nothing was changed" in response.content.decode()
    assert _team_state(team) == before
    assert client.post(team.url("invitation-new"), {"role": "admin"}).status_code == 201


def test_a_viewer_cannot_invite(team):
    before = _team_state(team)
    assert _as(team.viewer).post(team.url("invitation-new"), {"role": "viewer"}).status_code == 403
    assert _team_state(team) == before


# Accepting


def test_a_new_teammate_creates_an_account_from_the_link_and_is_signed_in_to_the_tenant(team):
    invitation, token = _invite(team, role="admin")
    client = Client()
    page = client.get(_accept_url(token))
    body = page.content.decode()
    assert page.status_code == 200 and "Join Tenant-A" in body and "<strong>admin</strong>" in body
    assert 'value="dana@example.com"' in body  # the note, when it is an address, fills the email
    response = client.post(_accept_url(token), _signup(email="dana@example.com"))
    assert response.status_code == 302 and response["Location"] == f"/dashboard/t/{team.a.slug}/"
    dana = get_user_model().objects.get(username="dana")
    assert dana.check_password(NEW_PASSWORD) and dana.email == "dana@example.com"
    assert team.membership(dana).role == "admin"
    invitation.refresh_from_db()
    assert invitation.used_at is not None and invitation.used_by_id == dana.pk
    assert _audit(team, "invitation.accept").actor == f"user:{dana.pk}"
    assert _audit(team, "membership.create").data == {"username": "dana", "role": "admin"}
    assert client.get(team.url("team")).status_code == 200  # signed in, a member


def test_an_invitation_works_once(team):
    _, token = _invite(team)
    Client().post(_accept_url(token), _signup("dana"))
    before = _team_state(team)
    again = Client().post(_accept_url(token), _signup("eve"))
    assert again.status_code == 410 and "already used" in again.content.decode()
    assert Client().get(_accept_url(token)).status_code == 410
    assert _team_state(team) == before


def test_an_expired_invitation_is_gone_and_an_unknown_one_not_found(team):
    invitation, token = _invite(team)
    Invitation.objects.filter(pk=invitation.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    before = _team_state(team)
    response = Client().post(_accept_url(token), _signup())
    assert response.status_code == 410 and "expired" in response.content.decode()
    assert Client().get(_accept_url(token)).status_code == 410
    assert _team_state(team) == before
    unknown = Client().get(_accept_url("no-invitation-has-this-token-" + "a" * 20))
    assert unknown.status_code == 404 and "not valid" in unknown.content.decode()
    assert Client().get(_accept_url("x" * 500)).status_code == 404


def _field_errors(page: str) -> dict[str, str]:
    """Each field's input id -> the error under it: the field's own block, not the next one's."""
    found = {}
    for block in re.findall(r'<div class="field field--error.*?</div>', page, re.S):
        field_id = re.search(r'<input[^>]*id="(id_[a-z0-9_]+)"', block)
        error = re.search(r'class="field__error"[^>]*>([^<]*)', block)
        if field_id and error:
            found[field_id.group(1)] = error.group(1)
    return found


def test_a_weak_or_mismatched_password_is_refused_beside_its_field_and_nothing_is_made(team):
    invitation, token = _invite(team)
    before = _team_state(team)
    weak = Client().post(_accept_url(token), _signup(password="password123"))
    assert weak.status_code == 400
    # Why a password is refused sits under the password, a mismatch under its confirmation.
    errors = _field_errors(weak.content.decode())
    assert list(errors) == ["id_password1"] and "too common" in errors["id_password1"]
    mismatched = Client().post(_accept_url(token), {**_signup(), "password2": NEW_PASSWORD + "!"})
    assert mismatched.status_code == 400
    errors = _field_errors(mismatched.content.decode())
    assert list(errors) == ["id_password2"] and "didn’t match" in errors["id_password2"]
    taken = Client().post(_accept_url(token), _signup("VERA"))
    assert taken.status_code == 400 and "already exists" in taken.content.decode()
    assert _team_state(team) == before
    invitation.refresh_from_db()
    assert invitation.used_at is None


def test_a_signed_in_user_joins_with_their_account(team):
    _, token = _invite(team, role="admin")
    client = _as(team.outsider)
    body = client.get(_accept_url(token)).content.decode()
    assert "Join as bob" in body and "Create your account" not in body
    response = client.post(_accept_url(token))
    assert response.status_code == 302
    assert team.membership(team.outsider).role == "admin"
    assert team.membership(team.outsider, team.b).role == "owner"  # their other tenant is untouched


def test_a_member_cannot_use_an_invitation_to_change_their_own_role(team):
    invitation, token = _invite(team, role="admin")
    client = _as(team.viewer)
    assert "already viewer of Tenant-A" in client.get(_accept_url(token)).content.decode()
    before = _team_state(team)
    assert client.post(_accept_url(token)).status_code == 409
    assert _team_state(team) == before


# Revoking


def test_a_revoked_invitation_opens_nothing(team):
    invitation, token = _invite(team, by=team.admin)
    client = _as(team.admin)
    url = team.url("invitation-revoke", invitation_id=invitation.pk)
    assert client.get(url).status_code == 200
    assert client.post(url).status_code == 302
    invitation.refresh_from_db()
    assert invitation.revoked_at is not None
    assert _audit(team, "invitation.revoke").actor == f"user:{team.admin.pk}"
    response = Client().post(_accept_url(token), _signup())
    assert response.status_code == 410 and "revoked" in response.content.decode()
    assert not get_user_model().objects.filter(username="dana").exists()


@pytest.mark.parametrize("state", ["used", "revoked", "expired"])
def test_revoking_an_invitation_that_is_no_longer_pending_says_so_and_changes_nothing(team, state):
    invitation, token = _invite(team)
    if state == "used":
        Client().post(_accept_url(token), _signup())
    elif state == "revoked":
        _as(team.owner).post(team.url("invitation-revoke", invitation_id=invitation.pk))
    else:
        Invitation.objects.filter(pk=invitation.pk).update(expires_at=timezone.now() - timedelta(minutes=1))
    before = _team_state(team)

    response = _as(team.admin).post(team.url("invitation-revoke", invitation_id=invitation.pk), follow=True)

    body = response.content.decode()
    assert f"Nothing changed: the invitation “dana@example.com” (viewer) was already {state}" in body
    assert "is revoked" not in body
    assert _team_state(team) == before


def test_an_admin_cannot_revoke_an_owner_invitation(team):
    invitation, _ = _invite(team, role="owner")
    url = team.url("invitation-revoke", invitation_id=invitation.pk)
    before = _team_state(team)
    for response in (_as(team.admin).get(url), _as(team.admin).post(url), _as(team.viewer).post(url)):
        assert response.status_code == 403
    assert _team_state(team) == before


def test_another_tenants_invitation_or_member_is_not_found_under_this_tenant(team, make_user):
    other = invitation_create(team.b, by=team.membership(team.outsider, team.b), role="viewer").invitation
    client = _as(team.owner)
    before = _team_state(team)
    url = team.url("invitation-revoke", invitation_id=other.pk)
    assert client.get(url).status_code == 404 and client.post(url).status_code == 404
    b_member = team.membership(team.outsider, team.b)
    for name in ("member-role", "member-remove", "member-password-reset"):
        url = team.url(name, membership_id=b_member.pk)
        assert client.get(url).status_code == 404
        assert client.post(url, {"role": "viewer"}).status_code == 404
    assert _team_state(team) == before


# Roles


def test_an_owner_makes_a_viewer_owner_and_the_audit_row_says_before_and_after(team):
    response = _as(team.owner).post(team.member_url("member-role", team.viewer), {"role": "owner"})
    assert response.status_code == 302
    assert team.membership(team.viewer).role == "owner"
    event = _audit(team, "membership.role_change")
    assert event.actor == f"user:{team.owner.pk}" and event.target_id == str(team.viewer.pk)
    assert event.data == {"username": "vera", "before": "viewer", "after": "owner"}


def test_an_admin_cannot_make_or_demote_an_owner(team):
    client = _as(team.admin)
    before = _team_state(team)
    assert client.post(team.member_url("member-role", team.viewer), {"role": "owner"}).status_code == 403
    assert client.get(team.member_url("member-role", team.owner)).status_code == 403
    assert client.post(team.member_url("member-role", team.owner), {"role": "viewer"}).status_code == 403
    assert _team_state(team) == before
    assert client.post(team.member_url("member-role", team.viewer), {"role": "admin"}).status_code == 302


def test_the_last_owner_cannot_be_demoted_and_the_error_sits_beside_the_role(team):
    client = _as(team.owner)
    url = team.member_url("member-role", team.owner)
    assert "is the last owner" in client.get(url).content.decode()
    before = _team_state(team)
    response = client.post(url, {"role": "admin"})
    assert response.status_code == 400
    assert re.search(r'field--error.*?id="id_role".*?is the last owner of Tenant-A', response.content.decode(), re.S)
    assert _team_state(team) == before


def test_with_two_owners_one_may_step_down_but_not_the_second(team):
    owner2 = team.membership(team.viewer)
    _as(team.owner).post(team.member_url("member-role", team.viewer), {"role": "owner"})
    assert _as(team.owner).post(team.member_url("member-role", team.owner), {"role": "admin"}).status_code == 302
    before = _team_state(team)
    response = _as(team.viewer).post(team.url("member-role", membership_id=owner2.pk), {"role": "admin"})
    assert response.status_code == 400
    assert _team_state(team) == before


def test_a_viewer_cannot_change_roles(team):
    before = _team_state(team)
    assert _as(team.viewer).post(team.member_url("member-role", team.admin), {"role": "viewer"}).status_code == 403
    assert _team_state(team) == before


# Removing


def test_an_admin_removes_a_viewer_who_then_sees_nothing_of_the_tenant(team):
    client = _as(team.admin)
    url = team.member_url("member-remove", team.viewer)
    assert client.get(url).status_code == 200
    assert client.post(url).status_code == 302
    assert not Membership.objects.filter(tenant=team.a, user=team.viewer).exists()
    event = _audit(team, "membership.remove")
    assert event.actor == f"user:{team.admin.pk}" and event.data == {"username": "vera", "role": "viewer"}
    assert _as(team.viewer).get(team.url("team")).status_code == 404
    assert get_user_model().objects.filter(pk=team.viewer.pk).exists()  # the account stays


def test_an_admin_cannot_remove_an_owner_and_a_viewer_nobody(team):
    before = _team_state(team)
    assert _as(team.admin).get(team.member_url("member-remove", team.owner)).status_code == 403
    assert _as(team.admin).post(team.member_url("member-remove", team.owner)).status_code == 403
    assert _as(team.viewer).post(team.member_url("member-remove", team.admin)).status_code == 403
    assert _team_state(team) == before


def test_the_last_owner_cannot_be_removed(team):
    client = _as(team.owner)
    url = team.member_url("member-remove", team.owner)
    page = client.get(url).content.decode()
    assert "cannot be removed" in page and "Leave Tenant-A</button>" not in page
    before = _team_state(team)
    response = client.post(url)
    assert response.status_code == 400
    assert "olivia is the last owner of Tenant-A and cannot be removed" in response.content.decode()
    assert "Nothing was changed" in response.content.decode()
    assert _team_state(team) == before


def test_a_member_who_leaves_goes_back_home(team):
    response = _as(team.admin).post(team.member_url("member-remove", team.admin))
    assert response.status_code == 302 and response["Location"] == "/dashboard/"


# Password reset links, handed over


def test_an_owner_hands_a_member_a_one_time_reset_link(team):
    client = _as(team.owner)
    url = team.member_url("member-password-reset", team.viewer)
    assert client.get(url).status_code == 200
    response = client.post(url)
    assert response.status_code == 201 and response["Cache-Control"] == "no-store"
    link = re.search(r'value="http://testserver(/dashboard/password/reset/[^"]+)"', response.content.decode()).group(1)
    event = _audit(team, "membership.password_reset_link")
    assert event.actor == f"user:{team.owner.pk}" and event.target_id == str(team.viewer.pk)
    _set_password_through(link)
    team.viewer.refresh_from_db()
    assert team.viewer.check_password(NEW_PASSWORD)
    assert Client().get(link, follow=True).context["validlink"] is False  # once


def _set_password_through(link: str) -> None:
    visitor = Client()
    form = visitor.get(link, follow=True)
    assert form.status_code == 200 and form.context["validlink"] is True
    done = visitor.post(form.redirect_chain[-1][0], {"new_password1": NEW_PASSWORD, "new_password2": NEW_PASSWORD})
    assert done.status_code == 302 and done["Location"] == "/dashboard/password/reset/complete/"


def test_an_admin_resets_viewers_but_not_owners(team):
    assert _as(team.admin).post(team.member_url("member-password-reset", team.viewer)).status_code == 201
    before = _team_state(team)
    assert _as(team.admin).get(team.member_url("member-password-reset", team.owner)).status_code == 403
    assert _as(team.admin).post(team.member_url("member-password-reset", team.owner)).status_code == 403
    assert _as(team.viewer).post(team.member_url("member-password-reset", team.admin)).status_code == 403
    assert _team_state(team) == before


def test_no_reset_link_for_a_member_of_a_tenant_the_actor_cannot_manage(team):
    """An owner of A must not get into B's owner through an account that is in both."""
    from apps.tenants.services import membership_create

    membership_create(team.a, user=team.outsider, role="viewer")
    before = _team_state(team)
    response = _as(team.owner).post(team.member_url("member-password-reset", team.outsider))
    assert response.status_code == 403 and "also a member of a tenant" in response.content.decode()
    assert _team_state(team) == before


# Forgotten password, by mail


def test_forgot_your_password_mails_a_link_that_sets_a_new_one(team):
    team.viewer.email = "vera@example.com"
    team.viewer.save(update_fields=["email"])
    login_page = Client().get("/dashboard/login/").content.decode()
    assert 'href="/dashboard/password/reset/">Forgot your password?' in login_page
    response = Client().post("/dashboard/password/reset/", {"email": "vera@example.com"})
    assert response.status_code == 302 and response["Location"] == "/dashboard/password/reset/sent/"
    assert len(mail.outbox) == 1 and mail.outbox[0].to == ["vera@example.com"]
    link = re.search(r"http://testserver(/dashboard/password/reset/\S+/)", mail.outbox[0].body).group(1)
    _set_password_through(link)
    assert _signed_in(Client(), "vera", NEW_PASSWORD)
    nobody = Client().post("/dashboard/password/reset/", {"email": "nobody@example.com"})
    assert nobody.status_code == 302 and nobody["Location"] == "/dashboard/password/reset/sent/"
    assert len(mail.outbox) == 1  # no mail, and the same answer, for an address nobody has


def _signed_in(client: Client, username: str, password: str) -> bool:
    response = client.post("/dashboard/login/", {"username": username, "password": password})
    return response.status_code == 302


def test_the_reset_pages_look_like_the_dashboard(team):
    for url in ("/dashboard/password/reset/", "/dashboard/password/reset/sent/", "/dashboard/password/reset/complete/"):
        body = Client().get(url).content.decode()
        assert "card--auth" in body and "dashboard/dashboard.css" in body
    assert "This reset link is not valid" in Client().get("/dashboard/password/reset/MQ/bad-token/").content.decode()


def test_the_old_password_stops_working_after_a_reset(team):
    response = _as(team.owner).post(team.member_url("member-password-reset", team.viewer))
    link = re.search(r'value="http://testserver(/dashboard/password/reset/[^"]+)"', response.content.decode()).group(1)
    _set_password_through(link)
    assert not _signed_in(Client(), "vera", PASSWORD)
