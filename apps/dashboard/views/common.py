from __future__ import annotations

from typing import Any

from django.core.paginator import Page, Paginator
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from apps.dashboard.access import TenantContext

PER_PAGE = 50


def page_of(request: HttpRequest, qs: QuerySet[Any], per_page: int = PER_PAGE) -> Page:
    """One page of ``qs`` (a count and a slice: two queries); a bad page number gives the nearest page."""
    return Paginator(qs, per_page).get_page(request.GET.get("page"))


def tenant_render(
    request: HttpRequest,
    ctx: TenantContext,
    template: str,
    context: dict[str, Any] | None = None,
    *,
    section: str = "",
    status: int = 200,
) -> HttpResponse:
    """Render a tenant page: ``ctx`` feeds the header and navigation, ``section`` marks the current entry."""
    context = {"ctx": ctx, "section": section, **(context or {})}
    context.setdefault("nav_adapter", ctx.default_adapter)
    return render(request, template, context, status=status)
