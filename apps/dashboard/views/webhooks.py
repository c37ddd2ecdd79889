"""Webhooks: register an endpoint for events (its signing secret shown once), rotate its secret,
delete one, and the delivery log of every attempt. Viewers see each endpoint's host only: a URL
often carries a token.

Adding a webhook and rotating its secret are Post/Redirect/Get: the POST acts, notes in the
session which secret it made (the webhook and when the secret was made, never the secret), and
redirects; the GET it leads to shows that secret once, read from the webhook, and forgets the note.
A reload repeats the GET, never the action. A form sent twice anyway (a double click, back and send
again) adds no second endpoint for the URL (the service refuses it) and rotates within
``ROTATION_REPEAT_WINDOW_S`` of the last rotation, which keeps the receiver's secret signing."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect

from apps.common.exceptions import ValidationFailed
from apps.dashboard.access import TenantContext, tenant_page
from apps.dashboard.forms import WebhookCreateForm, attach_service_error
from apps.dashboard.views.common import tenant_render
from apps.notifications.models import Webhook
from apps.notifications.selectors import webhook_delivery_list, webhook_get_for_tenant, webhook_list
from apps.notifications.services import webhook_create, webhook_delete, webhook_secret_rotate
from apps.notifications.services.webhooks import ROTATION_REPEAT_WINDOW_S

_SECRET_TO_SHOW = "dashboard.webhook_secret_to_show"


def _secret_made_at(webhook: Webhook) -> str:
    return (webhook.secret_rotated_at or webhook.created_at).isoformat()


def _show_secret_next(request: HttpRequest, webhook: Webhook, *, page: str) -> None:
    """Note that the next GET of ``page`` (``created`` or ``rotated``) shows the secret just made."""
    request.session[_SECRET_TO_SHOW] = {"page": page, "webhook": webhook.pk, "made_at": _secret_made_at(webhook)}


def _secret_to_show(request: HttpRequest, webhooks: list[Webhook], *, page: str) -> Webhook | None:
    """The webhook among ``webhooks`` whose secret a POST just made for ``page``, once; else None
    (nothing noted, or its secret rotated again since: that one is not this user's to see here)."""
    noted = request.session.get(_SECRET_TO_SHOW)
    if not isinstance(noted, dict) or noted.get("page") != page:
        return None
    del request.session[_SECRET_TO_SHOW]
    return next(
        (w for w in webhooks if w.pk == noted.get("webhook") and _secret_made_at(w) == noted.get("made_at")), None
    )


@tenant_page()
def webhooks(request: HttpRequest, ctx: TenantContext) -> HttpResponse:
    """GET lists the webhooks and the delivery log, and the signing secret of the webhook just
    added, once; POST (admins) registers one and leads back here."""
    form = WebhookCreateForm(request.POST if request.method == "POST" else None)
    status = 200
    if request.method == "POST":
        if not ctx.can_act:
            return tenant_render(request, ctx, "dashboard/forbidden.html", status=403)
        if form.is_valid():
            try:
                webhook = webhook_create(ctx.tenant, actor=ctx.actor, **form.cleaned_data)
            except ValidationFailed as exc:
                attach_service_error(form, exc)
            else:
                _show_secret_next(request, webhook, page="created")
                return redirect("dashboard:webhooks", tenant_slug=ctx.tenant.slug)
        status = 400
    webhooks = list(webhook_list(ctx.tenant))
    created = _secret_to_show(request, webhooks, page="created") if request.method == "GET" else None
    context = {
        "form": form,
        "created": created,
        "webhooks": webhooks,
        "deliveries": webhook_delivery_list(ctx.tenant),
    }
    response = tenant_render(request, ctx, "dashboard/webhooks/list.html", context, section="webhooks", status=status)
    if created is not None:
        response["Cache-Control"] = "no-store"  # the secret must not be kept by any cache
    return response


@tenant_page(action=True)
def webhook_rotate_view(request: HttpRequest, ctx: TenantContext, webhook_id: int) -> HttpResponse:
    """POST gives the webhook a new signing secret and leads back here; the GET that follows shows
    it once; any other GET confirms."""
    webhook = webhook_get_for_tenant(ctx.tenant, webhook_id=webhook_id)
    if request.method == "POST":
        rotated_now = webhook_secret_rotate(ctx.tenant, webhook=webhook, actor=ctx.actor)
        _show_secret_next(request, rotated_now, page="rotated")
        return redirect("dashboard:webhook-rotate", tenant_slug=ctx.tenant.slug, webhook_id=webhook.pk)
    rotated = _secret_to_show(request, [webhook], page="rotated")
    overlap_hours = round(settings.STROP_WEBHOOK_SECRET_OVERLAP_S / 3600, 1)
    context = {
        "webhook": webhook,
        "rotated": rotated,
        "overlap_hours": f"{overlap_hours:g}",
        "repeat_seconds": ROTATION_REPEAT_WINDOW_S,
    }
    response = tenant_render(request, ctx, "dashboard/webhooks/rotate.html", context, section="webhooks")
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
