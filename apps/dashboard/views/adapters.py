"""An adapter's versions (lineage, promotion) and its training policy."""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from apps.adapters.models import AdapterVersion
from apps.adapters.selectors import adapter_version_get_for_tenant
from apps.common.exceptions import ApplicationError, ValidationFailed
from apps.dashboard.access import TenantContext, tenant_page
from apps.dashboard.forms import attach_service_error
from apps.dashboard.offline_eval import version_offline_eval
from apps.dashboard.policy_form import TrainingPolicyForm
from apps.dashboard.selectors import adapter_lineage, adapter_serves_agents
from apps.dashboard.views.common import tenant_render
from apps.experiments.selectors import experiment_running_for
from apps.experiments.services import adapter_promote, adapter_rollback
from apps.privacy.purge import adapter_version_purge, version_purge_states
from apps.training.erasure import erased_users_per_version, retrain_parent, training_lineage_retrain
from apps.training.selectors import eval_set_get, training_policy_get
from apps.training.services import training_policy_update, training_run_start

PROMOTABLE = (AdapterVersion.Status.CANDIDATE, AdapterVersion.Status.IN_EXPERIMENT)


@tenant_page()
def versions(request: HttpRequest, ctx: TenantContext, adapter_name: str) -> HttpResponse:
    adapter = ctx.adapter(adapter_name)
    nodes = adapter_lineage(ctx.tenant, adapter=adapter)
    context = {
        "adapter": adapter,
        "nodes": nodes,
        # Each gated version's figures on the eval set; the empty state asks for a set when there is none.
        "offline_eval": {node.version.pk: version_offline_eval(node.gate, node.version) for node in nodes},
        "eval_set": eval_set_get(adapter),
        "erased": erased_users_per_version(adapter),
        "purge_states": version_purge_states(adapter),  # versions that learned from an erased user
        # Offered while the lineage the next run trains from holds a marked version (not after a retrain).
        "retrainable": bool(retrain_parent(adapter)[1]),
        "promotable": PROMOTABLE,
        "rollback_below": adapter.production_version.number if adapter.production_version else 0,
        "nav_adapter": adapter,
    }
    return tenant_render(request, ctx, "dashboard/versions/page.html", context, section="versions")


@tenant_page(action=True)
def version_promote(request: HttpRequest, ctx: TenantContext, adapter_name: str, number: int) -> HttpResponse:
    """GET states exactly what will change; POST moves the production pointer (loading the version
    into vLLM first when it is not loaded yet, as the API does)."""
    adapter = ctx.adapter(adapter_name)
    version = adapter_version_get_for_tenant(ctx.tenant, adapter=adapter, number=number)
    current = adapter.production_version
    if request.method == "POST":
        try:
            adapter_promote(ctx.tenant, version=version, actor=ctx.actor)
        except ApplicationError as exc:
            messages.error(request, f"Nothing changed: {exc.message}")
        else:
            was = f"v{current.number}" if current else "the base model"
            messages.success(request, f"v{version.number} now serves {adapter.name} in production (was {was}).")
        return redirect("dashboard:versions", tenant_slug=ctx.tenant.slug, adapter_name=adapter.name)
    context = {
        "adapter": adapter, "version": version, "current": current, "nav_adapter": adapter,
        "running": experiment_running_for(adapter),
    }  # fmt: skip
    return tenant_render(request, ctx, "dashboard/versions/promote.html", context, section="versions")


@tenant_page(action=True)
def version_rollback(request: HttpRequest, ctx: TenantContext, adapter_name: str, number: int) -> HttpResponse:
    """GET states exactly what will change; POST moves production back to this earlier version
    through ``adapter_rollback`` (which stops a running experiment first and audits it)."""
    adapter = ctx.adapter(adapter_name)
    version = adapter_version_get_for_tenant(ctx.tenant, adapter=adapter, number=number)
    current = adapter.production_version
    if request.method == "POST":
        try:
            adapter_rollback(ctx.tenant, adapter=adapter, to_version=version, actor=ctx.actor)
        except ApplicationError as exc:
            messages.error(request, f"Nothing changed: {exc.message}")
        else:
            was = f"v{current.number}" if current else "the base model"
            messages.success(
                request, f"Rolled back: v{version.number} serves {adapter.name} in production (was {was})."
            )
        return redirect("dashboard:versions", tenant_slug=ctx.tenant.slug, adapter_name=adapter.name)
    context = {
        "adapter": adapter,
        "version": version,
        "current": current,
        "running": experiment_running_for(adapter),
        "possible": version.status != AdapterVersion.Status.FAILED
        and (current is None or version.number < current.number),
        "nav_adapter": adapter,
    }
    return tenant_render(request, ctx, "dashboard/versions/rollback.html", context, section="versions")


@tenant_page(action=True)
def version_purge(request: HttpRequest, ctx: TenantContext, adapter_name: str, number: int) -> HttpResponse:
    """GET states what will be deleted; POST deletes every stored copy of the version's weights
    through ``adapter_version_purge`` (versions that learned from an erased user, once replaced)."""
    adapter = ctx.adapter(adapter_name)
    version = adapter_version_get_for_tenant(ctx.tenant, adapter=adapter, number=number)
    if request.method == "POST":
        try:
            adapter_version_purge(ctx.tenant, version=version, actor=ctx.actor)
        except ApplicationError as exc:
            messages.error(request, f"Nothing deleted: {exc.message}")
        else:
            messages.success(request, f"v{version.number}'s weights are purged from the adapter store.")
        return redirect("dashboard:versions", tenant_slug=ctx.tenant.slug, adapter_name=adapter.name)
    state = version_purge_states(adapter).get(version.pk)
    context = {"adapter": adapter, "version": version, "state": state, "nav_adapter": adapter}
    return tenant_render(request, ctx, "dashboard/versions/purge.html", context, section="versions")


@tenant_page()
def training_policy(request: HttpRequest, ctx: TenantContext, adapter_name: str) -> HttpResponse:
    """Everyone reads the policy; admins and owners change it (through training_policy_update)."""
    adapter = ctx.adapter(adapter_name)
    policy = training_policy_get(adapter)
    agent = adapter_serves_agents(adapter)
    form = TrainingPolicyForm.for_policy(policy, data=request.POST if request.method == "POST" else None, agent=agent)
    if request.method == "POST":
        if not ctx.can_act:
            return tenant_render(request, ctx, "dashboard/forbidden.html", status=403)
        if form.is_valid():
            changes = form.changes(policy)
            if not changes:
                messages.info(request, "Nothing to save: the policy already says that.")
                return redirect("dashboard:training-policy", tenant_slug=ctx.tenant.slug, adapter_name=adapter.name)
            try:
                training_policy_update(ctx.tenant, adapter=adapter, actor=ctx.actor, changes=changes)
            except ValidationFailed as exc:
                attach_service_error(form, exc)
            else:
                messages.success(request, f"Training policy saved: {', '.join(sorted(changes))}.")
                return redirect("dashboard:training-policy", tenant_slug=ctx.tenant.slug, adapter_name=adapter.name)
    context = {"adapter": adapter, "policy": policy, "form": form, "nav_adapter": adapter}
    status = 400 if form.is_bound and form.errors else 200
    return tenant_render(request, ctx, "dashboard/training/policy.html", context, section="runs", status=status)


@tenant_page(action=True)
@require_POST
def training_run_start_view(request: HttpRequest, ctx: TenantContext, adapter_name: str) -> HttpResponse:
    adapter = ctx.adapter(adapter_name)
    run = training_run_start(ctx.tenant, adapter=adapter, actor=ctx.actor)
    if run is None:
        messages.error(
            request, f"No run started: one is already going for {adapter.name}, or the tenant is at its cap."
        )
        return redirect("dashboard:runs", tenant_slug=ctx.tenant.slug)
    messages.success(request, f"Training run #{run.pk} queued for {adapter.name}.")
    return redirect("dashboard:run-detail", tenant_slug=ctx.tenant.slug, run_id=run.pk)


@tenant_page(action=True)
@require_POST
def lineage_retrain_view(request: HttpRequest, ctx: TenantContext, adapter_name: str) -> HttpResponse:
    """Retrain the lineage without the erased end users its versions learned from (one action)."""
    adapter = ctx.adapter(adapter_name)
    try:
        run = training_lineage_retrain(ctx.tenant, adapter=adapter, actor=ctx.actor)
    except ApplicationError as exc:
        messages.error(request, f"No run started: {exc.message}")
        return redirect("dashboard:versions", tenant_slug=ctx.tenant.slug, adapter_name=adapter.name)
    start = f"v{run.parent_version.number}" if run.parent_version else "the base model"
    messages.success(request, f"Training run #{run.pk} retrains {adapter.name} from {start} without erased users.")
    return redirect("dashboard:run-detail", tenant_slug=ctx.tenant.slug, run_id=run.pk)
