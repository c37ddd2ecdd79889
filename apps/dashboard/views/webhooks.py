"""Webhooks: register an endpoint for events (its signing secret shown once), rotate its secret,
delete one, and the delivery log of every attempt. Viewers see each endpoint's host only: a URL
often carries a token."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect

from apps.common.exceptions import ValidationFailed
from apps.dashboard.access import TenantContext, tenant_page
from apps.dashboard.forms import WebhookCreateForm, attach_service_error
from apps.dashboard.views.common import tenant_render
from apps.notifications.selectors import webhook_delivery_list, webhook_get_for_tenant, webhook_list
from apps.notifications.services import webhook_create, webhook_delete, webhook_secret_rotate


@tenant_page()
def webhooks(request: HttpRequest, ctx: TenantContext) -> HttpResponse:
    """GET lists the webhooks and the delivery log; POST (admins) registers one and shows its
    signing secret once, in this response only."""
    form = WebhookCreateForm(request.POST if request.method == "POST" else None)
    created = None
    status = 200
    if request.method == "POST":
        if not ctx.can_act:
            return tenant_render(request, ctx, "dashboard/forbidden.html", status=403)
        if form.is_valid():
            try:
                created = webhook_create(ctx.tenant, actor=ctx.actor, **form.cleaned_data)
            except ValidationFailed as exc:
                attach_service_error(form, exc)
            else:
                form = WebhookCreateForm()
                status = 201
        if form.errors:
            status = 400
    context = {
        "form": form,
        "created": created,
        "webhooks": webhook_list(ctx.tenant),
        "deliveries": webhook_delivery_list(ctx.tenant),
    }
    response = tenant_render(request, ctx, "dashboard/webhooks/list.html", context, section="webhooks", status=status)
    if created is not None:
        response["Cache-Control"] = "no-store"  # the secret must not be kept by any cache
    return response


@tenant_page(action=True)
def webhook_rotate_view(request: HttpRequest, ctx: TenantContext, webhook_id: int) -> HttpResponse:
    """GET confirms; POST gives the webhook a new signing secret and shows it once, in this response."""
    webhook = webhook_get_for_tenant(ctx.tenant, webhook_id=webhook_id)
    rotated = None
    if request.method == "POST":
        rotated = webhook_secret_rotate(ctx.tenant, webhook=webhook, actor=ctx.actor)
    overlap_hours = round(settings.STROP_WEBHOOK_SECRET_OVERLAP_S / 3600, 1)
    context = {"webhook": rotated or webhook, "rotated": rotated, "overlap_hours": f"{overlap_hours:g}"}
    status = 201 if rotated else 200
    response = tenant_render(request, ctx, "dashboard/webhooks/rotate.html", context, section="webhooks", status=status)
    if rotated is not None:
        response["Cache-Control"] = "no-store"
    return response


@tenant_page(action=True)
def webhook_delete_view(request: HttpRequest, ctx: TenantContext, webhook_id: int) -> HttpResponse:
    webhook = webhook_get_for_tenant(ctx.tenant, webhook_id=webhook_id)
    if request.method == "POST":
        webhook_delete(ctx.tenant, webhook=webhook, actor=ctx.actor)
        messages.success(request, f"Webhook {webhook.url} is deleted: it receives nothing from now on.")
        return redirect("dashboard:webhooks", tenant_slug=ctx.tenant.slug)
    return tenant_render(request, ctx, "dashboard/webhooks/delete.html", {"webhook": webhook}, section="webhooks")
