"""Downloads: the interactions list (with its filters) and an experiment's results, as CSV."""

from __future__ import annotations

from collections.abc import Iterator

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, StreamingHttpResponse
from django.utils import timezone

from apps.dashboard.access import TenantContext, tenant_page
from apps.dashboard.experiment_results import experiment_results
from apps.dashboard.exports import experiment_results_csv, interactions_csv
from apps.dashboard.forms import InteractionFilterForm
from apps.dashboard.selectors import interaction_search, version_choices
from apps.experiments.selectors import experiment_get_for_tenant


def _csv(lines: Iterator[str], filename: str) -> StreamingHttpResponse:
    response = StreamingHttpResponse(lines, content_type="text/csv; charset=utf-8")
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


@tenant_page()
def interactions_export(request: HttpRequest, ctx: TenantContext) -> HttpResponse | StreamingHttpResponse:
    """Every interaction the list's filters select (all pages), with its feedback; a 400 naming the
    filter that is invalid (never a download of more than was asked for)."""
    form = InteractionFilterForm(request.GET or None, versions=version_choices(ctx.tenant))
    filters = form.filters()
    if filters is None:
        problems = "\n".join(f"{name}: {' '.join(map(str, errors))}" for name, errors in form.errors.items())
        return HttpResponseBadRequest(
            f"Nothing was exported: a filter is invalid.\n{problems}\n", content_type="text/plain; charset=utf-8"
        )
    stamp = timezone.now().strftime("%Y%m%d-%H%M%S")
    return _csv(
        interactions_csv(interaction_search(ctx.tenant, filters=filters)),
        f"{ctx.tenant.slug}-interactions-{stamp}.csv",
    )


@tenant_page()
def experiment_results_export(request: HttpRequest, ctx: TenantContext, experiment_id: int) -> StreamingHttpResponse:
    """The latest statistics of one experiment, a row per metric."""
    experiment = experiment_get_for_tenant(ctx.tenant, experiment_id=experiment_id)
    results = experiment_results(experiment, with_history=False)
    return _csv(experiment_results_csv(results), f"{ctx.tenant.slug}-experiment-{experiment.pk}.csv")
