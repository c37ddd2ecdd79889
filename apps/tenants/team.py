"""A tenant's team: invitations (made, revoked, accepted), roles, removal, and password-reset links.

Who may do what, checked here so that every caller gets the same answer:

- viewers change nothing; admins and owners manage the team;
- an admin acts only on viewers and admins: never makes, removes, demotes or resets an owner, and
  never invites one;
- a tenant always keeps at least one owner: the last owner can be neither demoted nor removed.

Each change locks the tenant's memberships (in one ordered query) so two owners demoting each
other at once cannot leave the tenant without one, and writes its audit row in the same
transaction. An invitation's token exists only in the link shown once; the row keeps its keyed
hash (``apps.tenants.keys.hash_key``, like API keys).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone
from django.utils.encoding import force_bytes
from django.utils.http import urlsafe_base64_encode

from apps.common.exceptions import ApplicationError, Conflict, Forbidden, ValidationFailed
from apps.tenants.keys import hash_key
from apps.tenants.models import Invitation, Membership, Tenant
from apps.tenants.reset_tokens import handed_over_tokens
from apps.tenants.services import audit_record, membership_create

INVITATION_VALID_FOR = timedelta(days=7)
_TOKEN_BYTES = 32
Role = Membership.Role
ACTING_ROLES = frozenset({Role.OWNER, Role.ADMIN})


class InvitationUnusable(ApplicationError):
    """The invitation was used, revoked or has expired: its link opens nothing any more."""

    status_code = 410
    code = "invitation_unusable"


@dataclass(frozen=True)
class IssuedInvitation:
    """The stored invitation and its raw token, which exists only here and is shown once."""

    invitation: Invitation
    raw_token: str


@dataclass(frozen=True)
class PasswordResetLink:
    """What the password-reset confirmation page takes: the user's id, encoded, and a handed-over
    token (``apps.tenants.reset_tokens``) that stops working once the password, the member's or the
    issuer's memberships or roles change, or ``STROP_ADMIN_RESET_LINK_TTL_S`` passes."""

    uidb64: str
    token: str


def may_manage(acting_role: str, target_role: str) -> bool:
    """Whether a member with ``acting_role`` may act on a member or invitation with ``target_role``."""
    if acting_role == Role.OWNER:
        return True
    return acting_role == Role.ADMIN and target_role != Role.OWNER


def grantable_roles(acting_role: str) -> list[str]:
    """The roles a member with ``acting_role`` may give, by invitation or by a change of role."""
    return [role for role in Role.values if acting_role in ACTING_ROLES and may_manage(acting_role, role)]


def _actor(by: Membership) -> str:
    return f"user:{by.user_id}"


def _team_locked(tenant: Tenant) -> dict[int, Membership]:
    """The tenant's memberships, locked until the transaction ends, always in the same order."""
    return {
        m.pk: m
        for m in Membership.objects.select_for_update().filter(tenant=tenant).select_related("user").order_by("pk")
    }


def _acting_role(tenant: Tenant, team: dict[int, Membership], by: Membership) -> str:
    """The actor's role as it is now (read under the lock), refused unless it may act."""
    current = team.get(by.pk)
    if current is None or current.user_id != by.user_id:
        raise Forbidden(f"you are not a member of {tenant.name}")
    if current.role not in ACTING_ROLES:
        raise Forbidden("viewers read the team; only admins and owners change it")
    return current.role


def _check_role(role: str, acting_role: str, *, field: str = "role") -> None:
    if role not in Role.values:
        raise ValidationFailed(f"{field}: {role!r} is not a role; choose from {', '.join(Role.values)}")
    if not may_manage(acting_role, role):
        raise Forbidden("only an owner can make someone an owner")


def _check_target(acting_role: str, target: Membership) -> None:
    if not may_manage(acting_role, target.role):
        raise Forbidden(f"{target.user.get_username()} is an owner: only an owner can change or remove an owner")


def _owners(team: dict[int, Membership]) -> int:
    return sum(1 for m in team.values() if m.role == Role.OWNER)


@transaction.atomic
def invitation_create(tenant: Tenant, *, by: Membership, role: str, note: str = "") -> IssuedInvitation:
    acting_role = _acting_role(tenant, _team_locked(tenant), by)
    _check_role(role, acting_role)
    note = note.strip()
    if len(note) > 200:
        raise ValidationFailed("note: at most 200 characters")
    raw_token = secrets.token_urlsafe(_TOKEN_BYTES)
    invitation = Invitation.objects.create(
        tenant=tenant,
        role=role,
        note=note,
        token_hash=hash_key(raw_token),
        created_by_id=by.user_id,
        expires_at=timezone.now() + INVITATION_VALID_FOR,
    )
    audit_record(
        tenant,
        actor=_actor(by),
        action="invitation.create",
        target_type="invitation",
        target_id=str(invitation.pk),
        data={"role": role, "note": note, "expires_at": invitation.expires_at.isoformat()},
    )
    return IssuedInvitation(invitation=invitation, raw_token=raw_token)


@transaction.atomic
def invitation_revoke(tenant: Tenant, *, invitation: Invitation, by: Membership) -> Invitation:
    """Make a pending invitation's link open nothing. A used, revoked or expired one is left as it is,
    and refused (``InvitationUnusable``, its state in ``details``): there was nothing to revoke."""
    if invitation.tenant_id != tenant.pk:
        raise ValueError("invitation belongs to another tenant")
    acting_role = _acting_role(tenant, _team_locked(tenant), by)
    if not may_manage(acting_role, invitation.role):
        raise Forbidden("only an owner can revoke an invitation to become an owner")
    invitation = Invitation.objects.select_for_update().get(pk=invitation.pk)
    state = invitation.state(timezone.now())
    if state != "pending":
        raise InvitationUnusable(f"this invitation was {state}: there is nothing to revoke", details={"state": state})
    _revoke(tenant, invitation, by=by)
    return invitation


def _revoke(tenant: Tenant, invitation: Invitation, *, by: Membership, reason: str = "") -> None:
    """Mark a pending (locked) invitation revoked, audited; ``reason`` when no person chose it."""
    invitation.revoked_at = timezone.now()
    invitation.save(update_fields=["revoked_at"])
    data = {"role": invitation.role, "note": invitation.note, **({"reason": reason} if reason else {})}
    audit_record(
        tenant,
        actor=_actor(by),
        action="invitation.revoke",
        target_type="invitation",
        target_id=str(invitation.pk),
        data=data,
    )


def _invitation_claim(invitation: Invitation) -> Invitation:
    """The invitation, locked, if it can still be accepted: single use even when two people race."""
    locked = Invitation.objects.select_for_update().select_related("tenant").get(pk=invitation.pk)
    state = locked.state(timezone.now())
    if state != "pending":
        raise InvitationUnusable(f"this invitation was {state}", details={"state": state})
    return locked


def _accept(invitation: Invitation, *, user: Any) -> Membership:
    tenant = invitation.tenant
    existing = Membership.objects.filter(tenant=tenant, user=user).first()
    if existing is not None:
        raise Conflict(
            f"{user.get_username()} is already {existing.role} of {tenant.name}; the invitation is left unused",
            code="already_member",
        )
    actor = f"user:{user.pk}"
    membership = membership_create(tenant, user=user, role=invitation.role, actor=actor)
    invitation.used_at = timezone.now()
    invitation.used_by = user
    invitation.save(update_fields=["used_at", "used_by"])
    audit_record(
        tenant,
        actor=actor,
        action="invitation.accept",
        target_type="invitation",
        target_id=str(invitation.pk),
        data={"username": user.get_username(), "role": invitation.role},
    )
    return membership


@transaction.atomic
def invitation_accept(tenant: Tenant, *, invitation: Invitation, user: Any) -> Membership:
    """A signed-in user joins ``tenant`` with the invitation's role; the invitation is used up."""
    if invitation.tenant_id != tenant.pk:
        raise ValueError("invitation belongs to another tenant")
    return _accept(_invitation_claim(invitation), user=user)


@transaction.atomic
def invitation_accept_new_account(
    tenant: Tenant, *, invitation: Invitation, username: str, password: str, email: str = ""
) -> Membership:
    """Create a dashboard account (the password checked by ``AUTH_PASSWORD_VALIDATORS``) and join
    ``tenant`` with it, in one transaction: a refused invitation creates no account."""
    if invitation.tenant_id != tenant.pk:
        raise ValueError("invitation belongs to another tenant")
    invitation = _invitation_claim(invitation)
    users = get_user_model()._default_manager
    if users.filter(username__iexact=username).exists():
        raise ValidationFailed("username: that username is taken; choose another", code="username_taken")
    try:
        validate_password(password, user=users.model(username=username, email=email))
    except ValidationError as exc:
        raise ValidationFailed("password2: " + " ".join(exc.messages)) from None
    try:
        with transaction.atomic():
            user = users.create_user(username=username, email=email, password=password)
    except IntegrityError:
        raise ValidationFailed("username: that username is taken; choose another", code="username_taken") from None
    return _accept(invitation, user=user)


@transaction.atomic
def membership_role_change(tenant: Tenant, *, membership: Membership, role: str, by: Membership) -> Membership:
    """Give a member another role. The last owner keeps theirs."""
    team = _team_locked(tenant)
    acting_role = _acting_role(tenant, team, by)
    target = team.get(membership.pk)
    if target is None:
        raise ValueError("membership belongs to another tenant")
    _check_target(acting_role, target)
    _check_role(role, acting_role)
    if role == target.role:
        return target
    if target.role == Role.OWNER and _owners(team) == 1:
        raise ValidationFailed(
            f"role: {target.user.get_username()} is the last owner of {tenant.name}; make another member owner first",
            code="last_owner",
        )
    before = target.role
    target.role = role
    target.save(update_fields=["role"])
    audit_record(
        tenant,
        actor=_actor(by),
        action="membership.role_change",
        target_type="user",
        target_id=str(target.user_id),
        data={"username": target.user.get_username(), "before": before, "after": role},
    )
    _invitations_outgrown(tenant, creator=target, role=role, by=by)
    return target


@transaction.atomic
def membership_remove(tenant: Tenant, *, membership: Membership, by: Membership) -> None:
    """Take a member out of the tenant (their account stays, with its other tenants). Never the last owner."""
    team = _team_locked(tenant)
    acting_role = _acting_role(tenant, team, by)
    target = team.get(membership.pk)
    if target is None:
        raise ValueError("membership belongs to another tenant")
    _check_target(acting_role, target)
    if target.role == Role.OWNER and _owners(team) == 1:
        raise ValidationFailed(
            f"{target.user.get_username()} is the last owner of {tenant.name} and cannot be removed; "
            "make another member owner first",
            code="last_owner",
        )
    target.delete()
    audit_record(
        tenant,
        actor=_actor(by),
        action="membership.remove",
        target_type="user",
        target_id=str(target.user_id),
        data={"username": target.user.get_username(), "role": target.role},
    )
    _invitations_outgrown(tenant, creator=target, role=None, by=by)


def _invitations_outgrown(tenant: Tenant, *, creator: Membership, role: str | None, by: Membership) -> None:
    """Revoke the pending invitations ``creator`` made that their new ``role`` (None: removed from the
    team) could not make now: a removed admin's saved link must not bring them back as admin, nor a
    demoted owner's make owners. Each revocation is audited, as one made by hand is."""
    now = timezone.now()
    pending = Invitation.objects.select_for_update().filter(
        tenant=tenant, created_by_id=creator.user_id, used_at__isnull=True, revoked_at__isnull=True, expires_at__gt=now
    )
    for invitation in pending.order_by("pk"):
        if role is not None and role in ACTING_ROLES and may_manage(role, invitation.role):
            continue
        name = creator.user.get_username()
        why = f"its creator {name} was removed" if role is None else f"its creator {name} is now {role}"
        _revoke(tenant, invitation, by=by, reason=why)


def password_reset_refusal(*, user: Any, acting_user_id: int) -> str:
    """Why a reset link for ``user`` may not be handed out by ``acting_user_id``; empty when it may.

    A link opens the whole account, so the actor must be able to manage that account in every
    tenant it belongs to (an owner of A must not get into B through a member of both), and never
    for staff, whose account also opens the admin site."""
    if user.is_staff or user.is_superuser:
        return f"{user.get_username()} is a staff account: an operator resets it"
    acting = dict(Membership.objects.filter(user_id=acting_user_id).values_list("tenant_id", "role"))
    for tenant_id, role in Membership.objects.filter(user=user).values_list("tenant_id", "role"):
        if tenant_id not in acting or not may_manage(acting[tenant_id], role):
            return (
                f"{user.get_username()} is also a member of a tenant where you cannot manage them: "
                "they reset it themselves with “Forgot your password?”"
            )
    return ""


@transaction.atomic
def membership_password_reset_link(tenant: Tenant, *, membership: Membership, by: Membership) -> PasswordResetLink:
    """A one-time link that sets a member's password, to hand over when no mail server is assumed."""
    team = _team_locked(tenant)
    acting_role = _acting_role(tenant, team, by)
    target = team.get(membership.pk)
    if target is None:
        raise ValueError("membership belongs to another tenant")
    _check_target(acting_role, target)
    refusal = password_reset_refusal(user=target.user, acting_user_id=by.user_id)
    if refusal:
        raise Forbidden(refusal)
    audit_record(
        tenant,
        actor=_actor(by),
        action="membership.password_reset_link",
        target_type="user",
        target_id=str(target.user_id),
        data={"username": target.user.get_username(), "valid_for_s": settings.STROP_ADMIN_RESET_LINK_TTL_S},
    )
    return PasswordResetLink(
        uidb64=urlsafe_base64_encode(force_bytes(target.user.pk)),
        token=handed_over_tokens.make_token_for(target.user, issuer_id=by.user_id),
    )


def handed_over_link_refusal(*, user: Any, token: str | None) -> str:
    """Why a handed-over reset link may not be used now; empty when it may (and for a self-service link,
    which only the account's own mailbox receives). The link was checked when it was made; this asks
    the same rules again, for its issuer, as things stand when it is used."""
    issuer_id = handed_over_tokens.issuer_id(token)
    if issuer_id is None:
        return ""
    if not get_user_model()._default_manager.filter(pk=issuer_id, is_active=True).exists():
        return "the account that made this link no longer exists"
    return password_reset_refusal(user=user, acting_user_id=issuer_id)
