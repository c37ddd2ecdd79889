from __future__ import annotations

from itertools import zip_longest

from django.http import HttpRequest, HttpResponse

from apps.dashboard.access import TenantContext, tenant_page
from apps.dashboard.forms import InteractionFilterForm
from apps.dashboard.selectors import interaction_search, version_choices
from apps.dashboard.views.common import page_of, tenant_render
from apps.interactions.selectors import feedback_for_interaction, interaction_get_for_tenant
from apps.training.selectors import training_policy_get


@tenant_page()
def interaction_list(request: HttpRequest, ctx: TenantContext) -> HttpResponse:
    form = InteractionFilterForm(request.GET or None, versions=version_choices(ctx.tenant))
    page = page_of(request, interaction_search(ctx.tenant, filters=form.filters()))
    filtered = any(v for k, v in request.GET.items() if k != "page")
    context = {"form": form, "page": page, "filtered": filtered}
    return tenant_render(request, ctx, "dashboard/interactions/list.html", context, section="interactions")


@tenant_page()
def interaction_detail(request: HttpRequest, ctx: TenantContext, interaction_id: str) -> HttpResponse:
    """One interaction whole: the prompt, the completion, its tokens (ids and logprobs, nothing
    decoded) and the feedback, with the reward the adapter's policy gives it."""
    interaction = interaction_get_for_tenant(ctx.tenant, interaction_id=interaction_id)
    feedback = feedback_for_interaction(ctx.tenant, interaction=interaction)
    tokens = list(
        zip_longest(interaction.completion_token_ids or [], interaction.completion_logprobs or [], fillvalue=None)
    )
    adapter = next((a for a in ctx.adapters if a.pk == interaction.adapter_id), None)
    reward = None
    if feedback is not None and adapter is not None:
        reward = training_policy_get(adapter).reward_for(feedback.outcome)
    context = {
        "interaction": interaction,
        "feedback": feedback,
        "tokens": tokens,
        "adapter": adapter,
        "reward": reward,
        "version": interaction.adapter_version,
    }
    return tenant_render(request, ctx, "dashboard/interactions/detail.html", context, section="interactions")
