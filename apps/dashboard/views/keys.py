"""API keys (create: shown once; revoke) and the audit log."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect

from apps.common.exceptions import ValidationFailed
from apps.dashboard.access import TenantContext, tenant_page
from apps.dashboard.forms import ApiKeyCreateForm, AuditFilterForm, attach_service_error
from apps.dashboard.selectors import actor_labels, audit_action_choices, audit_event_search
from apps.dashboard.views.common import page_of, tenant_render
from apps.tenants.selectors import api_key_get_for_tenant, api_key_list
from apps.tenants.services import api_key_create, api_key_revoke


@tenant_page()
def keys(request: HttpRequest, ctx: TenantContext) -> HttpResponse:
    """GET lists the keys; POST (admins) creates one and shows it once, in this response only."""
    form = ApiKeyCreateForm(request.POST if request.method == "POST" else None)
    issued = None
    status = 200
    if request.method == "POST":
        if not ctx.can_act:
            return tenant_render(request, ctx, "dashboard/forbidden.html", status=403)
        if form.is_valid():
            try:
                issued = api_key_create(ctx.tenant, actor=ctx.actor, **form.cleaned_data)
            except ValidationFailed as exc:
                attach_service_error(form, exc)
            else:
                form = ApiKeyCreateForm()
                status = 201
        if form.errors:
            status = 400
    context = {"form": form, "issued": issued, "keys": api_key_list(ctx.tenant)}
    response = tenant_render(request, ctx, "dashboard/keys/list.html", context, section="keys", status=status)
    if issued is not None:
        response["Cache-Control"] = "no-store"  # the raw key must not be kept by any cache
    return response


@tenant_page(action=True)
def key_revoke(request: HttpRequest, ctx: TenantContext, key_id: int) -> HttpResponse:
    api_key = api_key_get_for_tenant(ctx.tenant, key_id=key_id)
    if request.method == "POST":
        api_key_revoke(ctx.tenant, api_key=api_key, actor=ctx.actor)
        messages.success(request, f"Key {api_key.name} (strop_{api_key.prefix}_…) is revoked: it stops working now.")
        return redirect("dashboard:keys", tenant_slug=ctx.tenant.slug)
    return tenant_render(request, ctx, "dashboard/keys/revoke.html", {"key": api_key}, section="keys")


@tenant_page()
def audit_log(request: HttpRequest, ctx: TenantContext) -> HttpResponse:
    form = AuditFilterForm(request.GET or None, actions=audit_action_choices(ctx.tenant))
    valid = not form.is_bound or form.is_valid()
    data = form.cleaned_data if form.is_bound and valid else {}
    events = audit_event_search(ctx.tenant, action=data.get("action", ""), actor=data.get("actor", ""))
    # An invalid filter: its error is beside it, and no event is listed until it is fixed (as on Interactions).
    page = page_of(request, events if valid else events.none())
    context = {
        "form": form,
        "page": page,
        "actor_labels": actor_labels({event.actor for event in page.object_list}),
        "filtered": not valid or bool(data.get("action") or data.get("actor")),
    }
    return tenant_render(request, ctx, "dashboard/audit/list.html", context, section="audit")
