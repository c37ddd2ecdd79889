"""An invitation does not outlive its creator's right to make it: removing a member, or giving them a
role that could not invite to it, revokes their pending invitations (a removed admin's saved link
must not bring them back as admin, nor a demoted owner's make owners), audited as a revocation."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from apps.tenants.models import AuditEvent, Membership
from tests.dashboard.test_team import _accept_url, _as, _invite, _signup, team  # noqa: F401  # the fixture

pytestmark = pytest.mark.django_db


def test_removing_an_admin_revokes_their_pending_invitations_and_the_link_opens_nothing(team):  # noqa: F811
    (invitation, token), (kept, _) = _invite(team, role="admin", by=team.admin), _invite(team, role="viewer")
    assert _as(team.owner).post(team.member_url("member-remove", team.admin)).status_code == 302
    invitation.refresh_from_db()
    kept.refresh_from_db()
    assert invitation.revoked_at is not None and kept.revoked_at is None  # the owner's own stays
    event = AuditEvent.objects.get(tenant=team.a, action="invitation.revoke", target_id=str(invitation.pk))
    assert event.actor == f"user:{team.owner.pk}" and event.data["reason"] == "its creator adam was removed"
    response = Client().post(_accept_url(token), _signup(username="adam2"))
    assert response.status_code == 410 and "revoked" in response.content.decode()
    assert not get_user_model().objects.filter(username="adam2").exists()


def test_a_demoted_owner_keeps_only_the_invitations_their_new_role_could_make(team):  # noqa: F811
    Membership.objects.filter(tenant=team.a, user=team.admin).update(role="owner")  # two owners
    (owner_invite, _), (viewer_invite, _) = _invite(team, role="owner", by=team.admin), _invite(team, by=team.admin)
    response = _as(team.owner).post(team.member_url("member-role", team.admin), {"role": "admin"})
    assert response.status_code == 302, response.content.decode()[:500]
    owner_invite.refresh_from_db()
    viewer_invite.refresh_from_db()
    assert owner_invite.revoked_at is not None  # an admin cannot invite an owner
    assert viewer_invite.revoked_at is None  # an admin can still invite a viewer
    _as(team.owner).post(team.member_url("member-role", team.admin), {"role": "viewer"})
    viewer_invite.refresh_from_db()
    assert viewer_invite.revoked_at is not None  # a viewer invites no one
