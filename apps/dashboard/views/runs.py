from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from apps.common.exceptions import ApplicationError
from apps.dashboard.access import TenantContext, tenant_page
from apps.dashboard.offline_eval import run_offline_eval
from apps.dashboard.selectors import CURVES, actor_labels, training_run_step_metrics
from apps.dashboard.views.common import page_of, tenant_render
from apps.training.models import TrainingRun
from apps.training.outlook import training_outlook
from apps.training.selectors import training_run_get_for_tenant, training_run_list
from apps.training.services import training_window_exclude

STAGES = ("export", "train", "gate", "load")


@tenant_page()
def run_list(request: HttpRequest, ctx: TenantContext) -> HttpResponse:
    adapter = ctx.adapter(request.GET["adapter"]) if request.GET.get("adapter") else None
    status = request.GET.get("status", "")
    runs = training_run_list(ctx.tenant, adapter=adapter).defer("log", "trainer_summary")
    if status in TrainingRun.Status.values:
        runs = runs.filter(status=status)
    context = {
        "page": page_of(request, runs),
        "adapter": adapter,
        "status": status,
        "statuses": TrainingRun.Status.values,
        "nav_adapter": adapter or ctx.default_adapter,
    }
    return tenant_render(request, ctx, "dashboard/training/runs.html", context, section="runs")


def _stages(run: TrainingRun) -> list[dict[str, object]]:
    seconds = {k: v for k, v in (run.stage_seconds or {}).items() if isinstance(v, int | float)}
    total = sum(seconds.values()) or 1.0
    names = [s for s in STAGES if s in seconds] + sorted(set(seconds) - set(STAGES))
    return [{"name": n, "seconds": seconds[n], "share": 100 * seconds[n] / total} for n in names]


@tenant_page()
def run_detail(request: HttpRequest, ctx: TenantContext, run_id: int) -> HttpResponse:
    run = training_run_get_for_tenant(ctx.tenant, run_id=run_id)
    curves = training_run_step_metrics(run)
    context = {
        "run": run,
        "stages": _stages(run),
        "curves": curves,
        "curve_series": [(label, curves.series(name)) for name, label in CURVES] if curves.steps else [],
        "offline_eval": run_offline_eval(run),
        "actor_labels": actor_labels({run.window_excluded_by} if run.window_excluded_by else set()),
        "nav_adapter": run.adapter,
    }
    return tenant_render(request, ctx, "dashboard/training/run.html", context, section="runs")


@tenant_page(action=True)
@require_POST
def run_exclude_window(request: HttpRequest, ctx: TenantContext, run_id: int) -> HttpResponse:
    """Leave a rejected run's events out of training (one action, on the run's page)."""
    run = training_run_get_for_tenant(ctx.tenant, run_id=run_id)
    try:
        run = training_window_exclude(ctx.tenant, run=run, actor=ctx.actor)
    except ApplicationError as exc:
        messages.error(request, exc.message)
    else:
        messages.success(
            request, f"Run #{run.pk}'s events are left out of training: the next run takes the ones after them."
        )
    return redirect("dashboard:run-detail", tenant_slug=ctx.tenant.slug, run_id=run.pk)


@tenant_page()
def run_status(request: HttpRequest, ctx: TenantContext, run_id: int) -> HttpResponse:
    """The state of a run, for htmx to refresh while it is active (it stops polling once it is not)."""
    run = training_run_get_for_tenant(ctx.tenant, run_id=run_id)
    return render(request, "dashboard/training/_run_status.html", {"ctx": ctx, "run": run, "stages": _stages(run)})


@tenant_page()
def training_status(request: HttpRequest, ctx: TenantContext, adapter_name: str) -> HttpResponse:
    """Why the adapter is, or is not, training: where its feedback went and what the next run waits for."""
    adapter = ctx.adapter(adapter_name)
    context = {"outlook": training_outlook(adapter), "nav_adapter": adapter, "adapter": adapter}
    return tenant_render(request, ctx, "dashboard/training/status.html", context, section="runs")
