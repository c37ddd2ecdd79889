from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from apps.dashboard.selectors import membership_list_for_user


@login_required
def home(request: HttpRequest) -> HttpResponse:
    """One tenant: straight to its overview; several: pick one; none: say so."""
    memberships = membership_list_for_user(request.user)
    if len(memberships) == 1:
        return redirect("dashboard:overview", tenant_slug=memberships[0].tenant.slug)
    return render(request, "dashboard/home.html", {"memberships": memberships})
