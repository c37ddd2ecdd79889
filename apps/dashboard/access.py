"""Who sees what on the dashboard.

Every tenant page is ``/dashboard/t/<tenant_slug>/...``. A page resolves the tenant only through
the signed-in user's memberships, so another tenant's slug is a 404 exactly like a slug that does
not exist. Viewers read; admins and owners act. Domain ``NotFound`` (another tenant's adapter,
run, key or interaction) becomes a 404 page.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import wraps
from typing import Any

from django.contrib.auth.views import redirect_to_login
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase
from django.shortcuts import render
from django.urls import reverse

from apps.adapters.models import Adapter
from apps.adapters.selectors import adapter_list
from apps.common.exceptions import NotFound
from apps.dashboard.selectors import membership_list_for_user
from apps.tenants.models import Membership, Tenant

ACTING_ROLES = frozenset({Membership.Role.OWNER, Membership.Role.ADMIN})


@dataclass
class TenantContext:
    """What every tenant page knows: the tenant, the user's role in it, and the tenant's adapters."""

    tenant: Tenant
    membership: Membership
    memberships: list[Membership]
    adapters: list[Adapter] = field(default_factory=list)

    @property
    def can_act(self) -> bool:
        return self.membership.role in ACTING_ROLES

    @property
    def role(self) -> str:
        return self.membership.role

    @property
    def actor(self) -> str:
        """How the audit log names a dashboard user."""
        return f"user:{self.membership.user_id}"

    @property
    def default_adapter(self) -> Adapter | None:
        return next((a for a in self.adapters if a.is_default), self.adapters[0] if self.adapters else None)

    def adapter(self, name: str) -> Adapter:
        """One of this tenant's adapters by name (they were listed for the navigation); 404 otherwise."""
        found = next((a for a in self.adapters if a.name == name), None)
        if found is None:
            raise Http404(f"adapter {name!r} not found")
        return found


TenantView = Callable[..., HttpResponseBase]


def tenant_page(*, action: bool = False) -> Callable[[TenantView], Callable[..., HttpResponseBase]]:
    """Wrap a view taking ``(request, ctx, **kwargs)``: sign-in, membership (404), role (403 for actions)."""

    def decorator(view: TenantView) -> Callable[..., HttpResponseBase]:
        @wraps(view)
        def wrapped(request: HttpRequest, tenant_slug: str, **kwargs: Any) -> HttpResponseBase:
            if not request.user.is_authenticated:
                if request.headers.get("HX-Request"):
                    # A polling fragment must not swap the login page into the page: reload it whole.
                    return HttpResponse(status=204, headers={"HX-Redirect": reverse("dashboard:login")})
                return redirect_to_login(request.get_full_path())
            ctx = tenant_context(request, tenant_slug)
            if action and not ctx.can_act:
                return render(request, "dashboard/forbidden.html", {"ctx": ctx}, status=403)
            try:
                return view(request, ctx, **kwargs)
            except NotFound as exc:
                raise Http404(exc.message) from None

        return wrapped

    return decorator


def tenant_context(request: HttpRequest, tenant_slug: str) -> TenantContext:
    memberships = membership_list_for_user(request.user)
    membership = next((m for m in memberships if m.tenant.slug == tenant_slug), None)
    if membership is None:
        raise Http404("no such tenant")
    ctx = TenantContext(tenant=membership.tenant, membership=membership, memberships=memberships)
    ctx.adapters = list(adapter_list(ctx.tenant))
    return ctx
