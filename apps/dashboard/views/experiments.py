"""An adapter's experiments: the list, one experiment's statistics (live), the actions on its
result (promote, roll back, stop: each a confirmation page, then the experiments service), and
starting one from a gated candidate."""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from apps.adapters.models import AdapterVersion
from apps.adapters.selectors import adapter_version_get_for_tenant, adapter_version_list
from apps.common.exceptions import ApplicationError, ValidationFailed
from apps.dashboard.access import TenantContext, tenant_page
from apps.dashboard.experiment_results import experiment_results, holdout_results
from apps.dashboard.forms import ExperimentStartForm, attach_service_error
from apps.dashboard.templatetags.dashboard import percent_figure
from apps.dashboard.views.common import page_of, tenant_render
from apps.experiments.models import Experiment
from apps.experiments.selectors import (
    alarms_recent,
    experiment_get_for_tenant,
    experiment_list,
    experiment_running_for,
    holdout_latest_snapshot,
    promotion_watch_current,
)
from apps.experiments.services import (
    adapter_holdout_set,
    experiment_create,
    experiment_promote,
    experiment_rollback,
    experiment_start,
    experiment_stop,
)

POLL_SECONDS = 5


@tenant_page()
def experiments(request: HttpRequest, ctx: TenantContext, adapter_name: str) -> HttpResponse:
    adapter = ctx.adapter(adapter_name)
    page = page_of(request, experiment_list(ctx.tenant, adapter=adapter))
    context = {
        "adapter": adapter,
        "page": page,
        "experiments": page.object_list,
        "running": experiment_running_for(adapter),
        "nav_adapter": adapter,
        "alarms": list(alarms_recent(ctx.tenant, adapter=adapter)[:10]),
        "holdout": holdout_results(adapter, holdout_latest_snapshot(adapter)),
        "watch": promotion_watch_current(adapter),
    }
    return tenant_render(request, ctx, "dashboard/experiments/list.html", context, section="experiments")


@tenant_page(action=True)
@require_POST
def experiments_holdout(request: HttpRequest, ctx: TenantContext, adapter_name: str) -> HttpResponse:
    """Set the share of the adapter's opted-in users kept on the base model (a percentage)."""
    adapter = ctx.adapter(adapter_name)
    raw = request.POST.get("holdout_percent", "").strip()
    try:
        share = float(raw) / 100
    except ValueError:
        messages.error(request, f"Nothing changed: the holdout must be a number of percent from 0 to 50, not {raw!r}.")
    else:
        try:
            adapter_holdout_set(ctx.tenant, adapter=adapter, share=share, actor=ctx.actor)
        except ValidationFailed as exc:
            messages.error(request, f"Nothing changed: {exc.message.replace('share', 'the holdout')} (0 to 50 %).")
        except ApplicationError as exc:
            messages.error(request, f"Nothing changed: {exc.message}")
        else:
            messages.success(
                request, f"{adapter.name} now keeps {percent_figure(share)}% of its opted-in users on the base model."
            )
    return redirect("dashboard:experiments", tenant_slug=ctx.tenant.slug, adapter_name=adapter.name)


def _detail_context(ctx: TenantContext, experiment: Experiment) -> dict[str, object]:
    return {
        "experiment": experiment,
        "adapter": experiment.adapter,
        "results": experiment_results(experiment),
        "poll": experiment.status == Experiment.Status.RUNNING,
        "poll_seconds": POLL_SECONDS,
        "nav_adapter": experiment.adapter,
        "alarms": list(alarms_recent(ctx.tenant, adapter=experiment.adapter)[:10]),
    }


@tenant_page()
def experiment_detail(request: HttpRequest, ctx: TenantContext, experiment_id: int) -> HttpResponse:
    experiment = experiment_get_for_tenant(ctx.tenant, experiment_id=experiment_id)
    context = _detail_context(ctx, experiment)
    return tenant_render(request, ctx, "dashboard/experiments/detail.html", context, section="experiments")


@tenant_page()
def experiment_live(request: HttpRequest, ctx: TenantContext, experiment_id: int) -> HttpResponse:
    """The statistics alone, for htmx to swap in while the experiment runs (polling stops after)."""
    experiment = experiment_get_for_tenant(ctx.tenant, experiment_id=experiment_id)
    return render(request, "dashboard/experiments/_live.html", {"ctx": ctx, **_detail_context(ctx, experiment)})


def _candidates(ctx: TenantContext, adapter: object) -> list[tuple[int, str]]:
    versions = adapter_version_list(ctx.tenant, adapter=adapter).filter(status=AdapterVersion.Status.CANDIDATE)  # type: ignore[arg-type]
    return [(v.number, f"v{v.number} · {v.vllm_name}") for v in versions.order_by("-number")]


@tenant_page(action=True)
def experiment_new(request: HttpRequest, ctx: TenantContext, adapter_name: str) -> HttpResponse:
    """GET: the form; POST: create the experiment and start it (the candidate is loaded on every
    replica and vLLM is checked to serve exactly its weights before it takes traffic)."""
    adapter = ctx.adapter(adapter_name)
    candidates = _candidates(ctx, adapter)
    form = ExperimentStartForm(request.POST if request.method == "POST" else None, candidates=candidates)
    running = experiment_running_for(adapter)
    if request.method == "POST" and form.is_valid():
        try:
            version = adapter_version_get_for_tenant(
                ctx.tenant, adapter=adapter, number=form.cleaned_data["candidate_version"]
            )
            experiment = experiment_create(
                ctx.tenant,
                adapter=adapter,
                candidate_version=version,
                actor=ctx.actor,
                candidate_weight=form.cleaned_data["candidate_weight"],
                config=form.config(),
                to_start=True,
            )
        except ValidationFailed as exc:
            attach_service_error(form, exc)
        except ApplicationError as exc:
            form.add_error(None, exc.message)
        else:
            try:
                experiment_start(ctx.tenant, experiment=experiment, actor=ctx.actor)
            except ApplicationError as exc:
                messages.error(request, f"Experiment #{experiment.pk} was created but did not start: {exc.message}")
            else:
                messages.success(
                    request,
                    f"Experiment #{experiment.pk} is running: v{version.number} serves "
                    f"{experiment.candidate_weight:.0%} of the opted-in users of {adapter.name}.",
                )
            return redirect("dashboard:experiment", tenant_slug=ctx.tenant.slug, experiment_id=experiment.pk)
    context = {"adapter": adapter, "form": form, "running": running, "nav_adapter": adapter}
    status = 400 if form.is_bound and form.errors else 200
    return tenant_render(request, ctx, "dashboard/experiments/new.html", context, section="experiments", status=status)


ExperimentService = Callable[..., Experiment]


def _experiment_action(
    request: HttpRequest, ctx: TenantContext, experiment_id: int, *, action: str, service: ExperimentService
) -> HttpResponse:
    """GET states exactly what the action will change; POST calls the experiments service (which
    writes the audit row) and shows the result on the experiment page."""
    experiment = experiment_get_for_tenant(ctx.tenant, experiment_id=experiment_id)
    adapter = experiment.adapter
    page = reverse("dashboard:experiment", kwargs={"tenant_slug": ctx.tenant.slug, "experiment_id": experiment.pk})
    expected = Experiment.Status.DRAFT if action == "start" else Experiment.Status.RUNNING
    asks_reason = request.method == "POST" and action != "start"  # the start's form has no reason
    reason = request.POST.get("reason", "").strip()[:500] if asks_reason else ""
    # Postgres stores no NUL character: one is an error beside the field, and nothing changes.
    reason_error = "The reason cannot hold a NUL character; type it again." if "\x00" in reason else ""
    if request.method == "POST" and not reason_error:
        try:
            service(ctx.tenant, experiment=experiment, actor=ctx.actor, reason=reason or f"{action} from the dashboard")
        except ApplicationError as exc:
            messages.error(request, f"Nothing changed: {exc.message}")
        else:
            adapter.refresh_from_db()
            production = adapter.production_version
            now = f"v{production.number}" if production else "the base model"
            candidate = f"v{experiment.candidate_version.number}"
            done = {
                "start": f"Experiment #{experiment.pk} is running: {candidate} serves "
                f"{experiment.candidate_weight:.0%} of the opted-in users of {adapter.name}.",
                "promote": f"Promoted: {candidate} now serves {adapter.name} in production.",
                "rollback": f"Rolled back: {candidate} is retired; {now} stays in production.",
                "stop": f"Stopped: everyone gets production ({now}) again; {candidate} stays a candidate.",
            }[action]
            messages.success(request, done)
        return redirect(page)
    results = experiment_results(experiment, with_history=False)
    context = {
        "experiment": experiment,
        "adapter": adapter,
        "action": action,
        "results": results,
        "actionable": experiment.status == expected,
        "nav_adapter": adapter,
        "cancel_url": page,
        "reason_error": reason_error,
    }
    status = 400 if reason_error else 200
    return tenant_render(
        request, ctx, "dashboard/experiments/confirm.html", context, section="experiments", status=status
    )


def _start(tenant: object, *, experiment: Experiment, actor: str, reason: str) -> Experiment:
    return experiment_start(tenant, experiment=experiment, actor=actor)  # type: ignore[arg-type]


@tenant_page(action=True)
def experiment_start_view(request: HttpRequest, ctx: TenantContext, experiment_id: int) -> HttpResponse:
    """A draft (one whose start failed, or was not asked for) starts from its page."""
    return _experiment_action(request, ctx, experiment_id, action="start", service=_start)


@tenant_page(action=True)
def experiment_promote_view(request: HttpRequest, ctx: TenantContext, experiment_id: int) -> HttpResponse:
    return _experiment_action(request, ctx, experiment_id, action="promote", service=experiment_promote)


@tenant_page(action=True)
def experiment_rollback_view(request: HttpRequest, ctx: TenantContext, experiment_id: int) -> HttpResponse:
    return _experiment_action(request, ctx, experiment_id, action="rollback", service=experiment_rollback)


@tenant_page(action=True)
def experiment_stop_view(request: HttpRequest, ctx: TenantContext, experiment_id: int) -> HttpResponse:
    return _experiment_action(request, ctx, experiment_id, action="stop", service=experiment_stop)
