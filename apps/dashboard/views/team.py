"""The team: members and their roles, invitations (the link shown once), changing a role, removing a
member, a password-reset link to hand over; and the public page that accepts an invitation.

Who may act on whom is ``apps.tenants.team``'s rule (``may_manage``): the pages ask it to show or
refuse a form, and the services ask it again under their lock."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import login
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone

from apps.common.exceptions import Conflict, Forbidden, ValidationFailed
from apps.dashboard.access import TenantContext, tenant_page
from apps.dashboard.forms import InvitationCreateForm, InvitationSignupForm, MemberRoleForm, attach_service_error
from apps.dashboard.selectors import membership_list_for_user
from apps.dashboard.views.common import tenant_render
from apps.tenants.models import Invitation, Membership
from apps.tenants.selectors import (
    invitation_get_by_token,
    invitation_get_for_tenant,
    invitation_list_pending,
    membership_get_for_tenant,
    membership_list,
    membership_owner_count,
)
from apps.tenants.team import (
    INVITATION_VALID_FOR,
    InvitationUnusable,
    grantable_roles,
    invitation_accept,
    invitation_accept_new_account,
    invitation_create,
    invitation_revoke,
    may_manage,
    membership_password_reset_link,
    membership_remove,
    membership_role_change,
    password_reset_refusal,
)

# The account a new member signs in with right after creating it (the only backend that logs in a
# user it did not authenticate; axes' backend only checks sign-in attempts).
_SIGNUP_BACKEND = "django.contrib.auth.backends.ModelBackend"
_RESET_PAGE = "dashboard/team/password_reset.html"


def _refused(request: HttpRequest, ctx: TenantContext, reason: str) -> HttpResponse:
    return tenant_render(request, ctx, "dashboard/team/forbidden.html", {"reason": reason}, section="team", status=403)


def _shown_once(response: HttpResponse) -> HttpResponse:
    response["Cache-Control"] = "no-store"  # a link that opens an account must not be kept by any cache
    return response


def _last_owner(ctx: TenantContext, membership: Membership) -> bool:
    return membership.role == Membership.Role.OWNER and membership_owner_count(ctx.tenant) == 1


@tenant_page()
def team(request: HttpRequest, ctx: TenantContext) -> HttpResponse:
    members = [(m, ctx.can_act and may_manage(ctx.role, m.role)) for m in membership_list(ctx.tenant)]
    invitations = [(i, ctx.can_act and may_manage(ctx.role, i.role)) for i in invitation_list_pending(ctx.tenant)]
    context = {"members": members, "invitations": invitations}
    return tenant_render(request, ctx, "dashboard/team/page.html", context, section="team")


@tenant_page(action=True)
def invitation_new(request: HttpRequest, ctx: TenantContext) -> HttpResponse:
    """GET is the form; POST creates the invitation and shows its link, in this response only."""
    roles = grantable_roles(ctx.role)
    form = InvitationCreateForm(request.POST if request.method == "POST" else None, roles=roles)
    issued, status = None, 200
    if request.method == "POST" and form.is_valid():
        try:
            issued = invitation_create(ctx.tenant, by=ctx.membership, **form.cleaned_data)
        except Forbidden as exc:
            return _refused(request, ctx, exc.message)
        except ValidationFailed as exc:
            attach_service_error(form, exc)
        else:
            form, status = InvitationCreateForm(roles=roles), 201
    if form.errors:
        status = 400
    context: dict[str, Any] = {"form": form, "issued": issued, "valid_days": INVITATION_VALID_FOR.days}
    if issued is not None:
        path = reverse("dashboard:invitation-accept", kwargs={"token": issued.raw_token})
        context["link"] = request.build_absolute_uri(path)
    response = tenant_render(request, ctx, "dashboard/team/invite.html", context, section="team", status=status)
    return _shown_once(response) if issued is not None else response


@tenant_page(action=True)
def invitation_revoke_view(request: HttpRequest, ctx: TenantContext, invitation_id: int) -> HttpResponse:
    invitation = invitation_get_for_tenant(ctx.tenant, invitation_id=invitation_id)
    if not may_manage(ctx.role, invitation.role):
        return _refused(request, ctx, "Only an owner can revoke an invitation to become an owner.")
    if request.method == "POST":
        label = _invitation_label(invitation)
        try:
            invitation_revoke(ctx.tenant, invitation=invitation, by=ctx.membership)
        except Forbidden as exc:
            return _refused(request, ctx, exc.message)
        except InvitationUnusable as exc:
            state = exc.details["state"]
            messages.error(request, f"Nothing changed: the invitation {label} was already {state}; nothing to revoke.")
        else:
            messages.success(request, f"The invitation {label} is revoked: its link opens nothing now.")
        return redirect("dashboard:team", tenant_slug=ctx.tenant.slug)
    state = invitation.state(timezone.now())
    context = {"invitation": invitation, "label": _invitation_label(invitation), "state": state}
    return tenant_render(request, ctx, "dashboard/team/revoke.html", context, section="team")


def _invitation_label(invitation: Invitation) -> str:
    return f"“{invitation.note}” ({invitation.role})" if invitation.note else f"for a new {invitation.role}"


@tenant_page(action=True)
def member_role(request: HttpRequest, ctx: TenantContext, membership_id: int) -> HttpResponse:
    """GET is the form; POST changes the role. The last owner's demotion is an error beside the field."""
    membership = membership_get_for_tenant(ctx.tenant, membership_id=membership_id)
    if not may_manage(ctx.role, membership.role):
        return _refused(request, ctx, f"{membership.user.get_username()} is an owner: only an owner changes an owner.")
    data = request.POST if request.method == "POST" else None
    form = MemberRoleForm(data, roles=grantable_roles(ctx.role), initial={"role": membership.role})
    if data is not None and form.is_valid():
        before, username = membership.role, membership.user.get_username()
        try:
            changed = membership_role_change(
                ctx.tenant, membership=membership, role=form.cleaned_data["role"], by=ctx.membership
            )
        except Forbidden as exc:
            return _refused(request, ctx, exc.message)
        except ValidationFailed as exc:
            attach_service_error(form, exc)
        else:
            if changed.role == before:
                messages.info(request, f"{username} is already {before}: nothing changed.")
            else:
                messages.success(request, f"{username} is now {changed.role} (was {before}).")
            return redirect("dashboard:team", tenant_slug=ctx.tenant.slug)
    context = {"member": membership, "form": form, "last_owner": _last_owner(ctx, membership)}
    status = 400 if form.errors else 200
    return tenant_render(request, ctx, "dashboard/team/role.html", context, section="team", status=status)


@tenant_page(action=True)
def member_remove(request: HttpRequest, ctx: TenantContext, membership_id: int) -> HttpResponse:
    membership = membership_get_for_tenant(ctx.tenant, membership_id=membership_id)
    username = membership.user.get_username()
    if not may_manage(ctx.role, membership.role):
        return _refused(request, ctx, f"{username} is an owner: only an owner removes an owner.")
    error, status = "", 200
    if request.method == "POST":
        try:
            membership_remove(ctx.tenant, membership=membership, by=ctx.membership)
        except Forbidden as exc:
            return _refused(request, ctx, exc.message)
        except ValidationFailed as exc:
            error, status = exc.message, 400
        else:
            messages.success(request, f"{username} is no longer a member of {ctx.tenant.name}.")
            if membership.user_id == request.user.pk:
                return redirect("dashboard:home")
            return redirect("dashboard:team", tenant_slug=ctx.tenant.slug)
    context = {"member": membership, "error": error, "last_owner": _last_owner(ctx, membership)}
    return tenant_render(request, ctx, "dashboard/team/remove.html", context, section="team", status=status)


@tenant_page(action=True)
def member_password_reset(request: HttpRequest, ctx: TenantContext, membership_id: int) -> HttpResponse:
    """GET says what the link does; POST makes it and shows it, in this response only."""
    membership = membership_get_for_tenant(ctx.tenant, membership_id=membership_id)
    if not may_manage(ctx.role, membership.role):
        return _refused(request, ctx, f"{membership.user.get_username()} is an owner: only an owner resets an owner.")
    refusal = password_reset_refusal(user=membership.user, acting_user_id=ctx.membership.user_id)
    if refusal:
        return _refused(request, ctx, refusal)
    context: dict[str, Any] = {
        "member": membership,
        "link": "",
        "reset_minutes": settings.STROP_ADMIN_RESET_LINK_TTL_S // 60,
    }
    if request.method == "POST":
        try:
            reset = membership_password_reset_link(ctx.tenant, membership=membership, by=ctx.membership)
        except Forbidden as exc:
            return _refused(request, ctx, exc.message)
        path = reverse("dashboard:password-reset-confirm", kwargs={"uidb64": reset.uidb64, "token": reset.token})
        context["link"] = request.build_absolute_uri(path)
        return _shown_once(tenant_render(request, ctx, _RESET_PAGE, context, section="team", status=201))
    return tenant_render(request, ctx, _RESET_PAGE, context, section="team")


def invitation_accept_view(request: HttpRequest, token: str) -> HttpResponse:
    """Public: a valid link shows the tenant and the role, and a form to create an account (or, signed
    in, to join with this one). An unknown link is a 404; a used, revoked or expired one a 410."""
    invitation = invitation_get_by_token(token)
    if invitation is None:
        return _unusable(request, None, status=404)
    if invitation.state(timezone.now()) != "pending":
        return _unusable(request, invitation, status=410)
    tenant, signed_in = invitation.tenant, request.user.is_authenticated
    data = request.POST if request.method == "POST" and not signed_in else None
    form = InvitationSignupForm(data, initial={"email": invitation.note if "@" in invitation.note else ""})
    error, status = "", 200
    if request.method == "POST" and (signed_in or form.is_valid()):
        try:
            if signed_in:
                membership = invitation_accept(tenant, invitation=invitation, user=request.user)
            else:
                membership = invitation_accept_new_account(
                    tenant,
                    invitation=invitation,
                    username=form.cleaned_data["username"],
                    password=form.cleaned_data["password1"],
                    email=form.cleaned_data["email"],
                )
                login(request, membership.user, backend=_SIGNUP_BACKEND)
        except InvitationUnusable:
            invitation.refresh_from_db()
            return _unusable(request, invitation, status=410)
        except Conflict as exc:
            error, status = exc.message, 409
        except ValidationFailed as exc:
            attach_service_error(form, exc)
        else:
            messages.success(request, f"Welcome to {tenant.name}: you are {membership.role}.")
            return redirect("dashboard:overview", tenant_slug=tenant.slug)
    if form.errors:
        status = 400
    member_of = (
        next((m for m in membership_list_for_user(request.user) if m.tenant_id == tenant.pk), None)
        if signed_in
        else None
    )
    context = {"invitation": invitation, "tenant": tenant, "form": form, "error": error, "member_of": member_of}
    # The token is in this page's address: no cache keeps it, and Django's Referrer-Policy
    # (SECURE_REFERRER_POLICY, "same-origin") sends it to no other site. ("no-referrer" would make
    # the browser send "Origin: null" with the form, which CSRF protection rightly refuses.)
    return _shown_once(render(request, "dashboard/team/accept.html", context, status=status))


def _unusable(request: HttpRequest, invitation: Invitation | None, *, status: int) -> HttpResponse:
    state = invitation.state(timezone.now()) if invitation is not None else "unknown"
    context = {"invitation": invitation, "state": state}
    return render(request, "dashboard/team/invitation_unusable.html", context, status=status)
