"""The tenant's own settings: everyone reads them; admins and owners change them."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect

from apps.common.exceptions import ValidationFailed
from apps.dashboard.access import TenantContext, tenant_page
from apps.dashboard.forms import TenantSettingsForm, attach_service_error
from apps.dashboard.views.common import tenant_render
from apps.tenants.services import TENANT_SETTINGS, tenant_settings_update


@tenant_page()
def tenant_settings(request: HttpRequest, ctx: TenantContext) -> HttpResponse:
    initial = {name: getattr(ctx.tenant, name) for name in TENANT_SETTINGS}
    form = TenantSettingsForm(request.POST if request.method == "POST" else None, initial=initial)
    if request.method == "POST":
        if not ctx.can_act:
            return tenant_render(request, ctx, "dashboard/forbidden.html", status=403)
        if form.is_valid():
            changes = {name: value for name, value in form.cleaned_data.items() if value != initial[name]}
            if not changes:
                messages.info(request, "Nothing to save: the settings already say that.")
                return redirect("dashboard:settings", tenant_slug=ctx.tenant.slug)
            try:
                tenant_settings_update(ctx.tenant, actor=ctx.actor, changes=changes)
            except ValidationFailed as exc:
                attach_service_error(form, exc)
            else:
                messages.success(request, f"Settings saved: {', '.join(sorted(changes))}.")
                return redirect("dashboard:settings", tenant_slug=ctx.tenant.slug)
    status = 400 if form.is_bound and form.errors else 200
    return tenant_render(
        request, ctx, "dashboard/settings/page.html", {"form": form}, section="settings", status=status
    )
