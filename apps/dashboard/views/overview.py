from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from apps.adapters.models import Adapter
from apps.dashboard.access import TenantContext, tenant_page
from apps.dashboard.selectors import tenant_has_traffic
from apps.dashboard.stats import (
    DEFAULT_RANGE,
    TIME_RANGES,
    adapter_active_run,
    adapter_last_finished_run,
    adapter_live_numbers,
    adapter_timeseries,
)
from apps.dashboard.views.common import tenant_render
from apps.experiments.selectors import experiment_latest_snapshot, experiment_running_for
from apps.training.selectors import training_policy_get


def _live_context(adapter: Adapter) -> dict[str, object]:
    policy = training_policy_get(adapter)
    experiment = experiment_running_for(adapter)
    return {
        "adapter": adapter,
        "policy": policy,
        "live": adapter_live_numbers(adapter, policy=policy),
        "active_run": adapter_active_run(adapter),
        "experiment": experiment,
        "experiment_snapshot": experiment_latest_snapshot(experiment) if experiment else None,
    }


@tenant_page()
def overview(request: HttpRequest, ctx: TenantContext, adapter_name: str | None = None) -> HttpResponse:
    """Per adapter: production version, the live numbers, rates over time with version changes marked."""
    adapter = ctx.adapter(adapter_name) if adapter_name else ctx.default_adapter
    if adapter is None:
        return tenant_render(request, ctx, "dashboard/overview/empty.html", section="overview")
    if not tenant_has_traffic(ctx.tenant):
        context = {"adapter": adapter, "nav_adapter": adapter, "base_url": request.build_absolute_uri("/").rstrip("/")}
        return tenant_render(request, ctx, "dashboard/overview/first_run.html", context, section="overview")
    range_key = request.GET.get("range", DEFAULT_RANGE)
    range_key = range_key if range_key in TIME_RANGES else DEFAULT_RANGE
    context = _live_context(adapter)
    context.update(
        ranges=TIME_RANGES.values(),
        range_key=range_key,
        timeseries=adapter_timeseries(adapter, policy=context["policy"], range_key=range_key),  # type: ignore[arg-type]
        last_run=adapter_last_finished_run(adapter),
        nav_adapter=adapter,
    )
    return tenant_render(request, ctx, "dashboard/overview/page.html", context, section="overview")


@tenant_page()
def overview_live(request: HttpRequest, ctx: TenantContext, adapter_name: str) -> HttpResponse:
    """The live numbers alone, for htmx to swap in every few seconds. Asked by the first-run page
    (``?first_event=1``): its waiting line again, or, once an interaction has arrived, a reload
    into the overview (htmx's ``HX-Refresh``)."""
    adapter = ctx.adapter(adapter_name)
    if request.GET.get("first_event"):
        if tenant_has_traffic(ctx.tenant):
            return HttpResponse(status=204, headers={"HX-Refresh": "true"})
        return render(request, "dashboard/overview/_first_event.html", {"ctx": ctx, "adapter": adapter})
    return render(request, "dashboard/overview/_live.html", {"ctx": ctx, **_live_context(adapter)})
