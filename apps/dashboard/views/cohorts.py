"""Cohorts: opt-in counts over time, finding an end user, their consent and what Strop holds
about them; opting them in or out (the cohorts services) and erasing them (the privacy ones)."""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils.http import urlencode
from django.views.decorators.http import require_POST

from apps.cohorts.models import ConsentChange
from apps.cohorts.selectors import (
    COUNT_CAP,
    EndUserPage,
    end_user_counts_capped,
    end_user_get_for_tenant,
    end_user_list,
    end_user_page,
)
from apps.cohorts.services import end_user_consent_set
from apps.common.exceptions import ValidationFailed
from apps.dashboard import charts
from apps.dashboard.access import TenantContext, tenant_page
from apps.dashboard.cohort_stats import optin_over_time
from apps.dashboard.forms import EndUserSearchForm
from apps.dashboard.views.common import PER_PAGE, tenant_render
from apps.privacy.selectors import end_user_detail, end_user_erase_preview
from apps.privacy.services import end_user_erase

STATES = {"in": True, "out": False}


def _external_id(request: HttpRequest) -> str:
    """The end user a request names (``end_user_id`` in the query or the form); 404 when absent, or
    when no end user could have that id (Postgres stores no NUL character, so the lookup would fail)."""
    value = (request.POST.get("end_user_id") if request.method == "POST" else None) or request.GET.get(
        "end_user_id", ""
    )
    if not value.strip() or len(value) > 200 or "\x00" in value:
        raise Http404("no end user named")
    return value


def end_user_url(ctx: TenantContext, external_id: str) -> str:
    return (
        reverse("dashboard:end-user", kwargs={"tenant_slug": ctx.tenant.slug})
        + "?"
        + urlencode({"end_user_id": external_id})
    )


@tenant_page()
def cohorts(request: HttpRequest, ctx: TenantContext) -> HttpResponse:
    form = EndUserSearchForm(request.GET or None)
    data = form.cleaned_data if form.is_valid() else {}
    if form.errors:  # a filter is invalid: its error is beside it, and no user is listed until it is fixed
        page = EndUserPage(object_list=[], next=None, first=True)
    else:
        users = end_user_list(ctx.tenant, search=data.get("q") or None, opted_in=STATES.get(data.get("state", "")))
        page = end_user_page(users, after=request.GET.get("after"), per_page=PER_PAGE)
    counts = end_user_counts_capped(ctx.tenant, cap=COUNT_CAP)
    relative = counts["opted_in"].more  # too many to count on every request: the chart shows the change
    days = optin_over_time(ctx.tenant, opted_in_now=None if relative else counts["opted_in"].value)
    chart = charts.line_chart(
        [(d.day, d.opted_in) for d in days],
        title=(
            "Change in end users opted in since the first of the last 30 days"
            if relative
            else "End users opted in at the end of each day, last 30 days"
        ),
        x_format=lambda moment: moment.strftime("%d %b"),
        y_min=None if relative else 0,
        empty_text="No end users yet",
    )
    context = {
        "form": form,
        "page": page,
        "counts": counts,
        "relative": relative,
        "cap": COUNT_CAP,
        "days": [d for d in reversed(days) if d.opt_ins or d.opt_outs],
        "chart": chart,
        "filtered": bool(form.errors or data.get("q") or data.get("state")),
    }
    return tenant_render(request, ctx, "dashboard/cohorts/page.html", context, section="cohorts")


@tenant_page()
def end_user(request: HttpRequest, ctx: TenantContext) -> HttpResponse:
    user = end_user_get_for_tenant(ctx.tenant, external_id=_external_id(request))
    context = {"end_user": user, **end_user_detail(ctx.tenant, end_user=user)}
    return tenant_render(request, ctx, "dashboard/cohorts/end_user.html", context, section="cohorts")


@tenant_page(action=True)
@require_POST
def end_user_consent(request: HttpRequest, ctx: TenantContext) -> HttpResponse:
    external_id = _external_id(request)
    end_user_get_for_tenant(ctx.tenant, external_id=external_id)  # only a user the tenant knows
    opted_in = request.POST.get("opted_in") == "true"
    try:
        end_user_consent_set(
            ctx.tenant,
            external_id=external_id,
            opted_in=opted_in,
            source=ConsentChange.Source.DASHBOARD,
            actor=ctx.actor,
        )
    except ValidationFailed as exc:
        messages.error(request, f"Nothing changed: {exc.message}")
    else:
        if opted_in:
            messages.success(request, f"{external_id} is opted in: their events from now on may train models.")
        else:
            messages.success(
                request,
                f"{external_id} is opted out: none of their events trains a later run, and they leave experiments.",
            )
    return redirect(end_user_url(ctx, external_id))


@tenant_page(action=True)
def end_user_erase_view(request: HttpRequest, ctx: TenantContext) -> HttpResponse:
    """GET shows what will go (counted now); POST erases and reports what went."""
    external_id = _external_id(request)
    if request.method == "POST":
        report = end_user_erase(ctx.tenant, external_id=external_id, actor=ctx.actor)
        counts = ", ".join(f"{n} {name.replace('_', ' ')}" for name, n in report.deleted.items())
        text = f"Erased {external_id}: {counts}."
        if report.versions_trained_on:
            names = ", ".join(f"{v['adapter']} v{v['version']}" for v in report.versions_trained_on)
            text += (
                f" Versions that trained on their events: {names}; retrain them from the adapter's Versions page,"
                " and purge their weights there once replaced."
            )
        stopped = [r["run"] for r in report.training_runs if r["action"].startswith("discarded")]
        if stopped:
            text += f" Training runs discarded and started again without them: {', '.join(f'#{n}' for n in stopped)}."
        messages.success(request, text)
        return redirect("dashboard:cohorts", tenant_slug=ctx.tenant.slug)
    preview = end_user_erase_preview(ctx.tenant, external_id=external_id)
    context = {"external_id": external_id, "preview": preview, "back": end_user_url(ctx, external_id)}
    return tenant_render(request, ctx, "dashboard/cohorts/erase.html", context, section="cohorts")
