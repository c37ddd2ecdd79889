from __future__ import annotations

from itertools import zip_longest
from typing import Any

from django.http import HttpRequest, HttpResponse

from apps.dashboard.access import TenantContext, tenant_page
from apps.dashboard.forms import InteractionFilterForm
from apps.dashboard.selectors import InteractionPage, interaction_page, interaction_search, version_choices
from apps.dashboard.views.common import PER_PAGE, tenant_render
from apps.interactions.models import Interaction
from apps.interactions.selectors import (
    conversation_turns,
    feedback_for_interaction,
    interaction_get_for_tenant,
    persistence_for_interaction,
)
from apps.training.selectors import interaction_adapter, training_policy_get


@tenant_page()
def interaction_list(request: HttpRequest, ctx: TenantContext) -> HttpResponse:
    form = InteractionFilterForm(request.GET or None, versions=version_choices(ctx.tenant))
    filters = form.filters()
    if filters is None:  # a filter is invalid: its error is beside it, and no row is listed until it is fixed
        page = InteractionPage(object_list=[], older=None, first=True)
    else:
        page = interaction_page(
            interaction_search(ctx.tenant, filters=filters), after=request.GET.get("after"), per_page=PER_PAGE
        )
    filtered = any(v for k, v in request.GET.items() if k not in ("page", "after"))
    context = {"form": form, "page": page, "filtered": filtered}
    return tenant_render(request, ctx, "dashboard/interactions/list.html", context, section="interactions")


@tenant_page()
def interaction_detail(request: HttpRequest, ctx: TenantContext, interaction_id: str) -> HttpResponse:
    """One interaction whole: the prompt, the completion, its tokens (ids and logprobs, nothing
    decoded), the feedback, with the reward the adapter's policy gives it, and what of an accepted
    completion was still there at each persistence checkpoint (retained characters)."""
    interaction = interaction_get_for_tenant(ctx.tenant, interaction_id=interaction_id)
    feedback = feedback_for_interaction(ctx.tenant, interaction=interaction)
    tokens = list(
        zip_longest(interaction.completion_token_ids or [], interaction.completion_logprobs or [], fillvalue=None)
    )
    adapter = interaction_adapter(interaction, adapters=ctx.adapters)  # the overview's and training's rule
    reward = None
    if feedback is not None and adapter is not None:
        reward = training_policy_get(adapter).reward_of(feedback)
    conversation = _conversation(interaction)
    turns = conversation_turns(ctx.tenant, conversation_id=interaction.conversation_id) if conversation else []
    context = {
        "interaction": interaction,
        "conversation": conversation,
        "tool_calls": (interaction.metadata or {}).get("tool_calls") or [],
        "turns": turns,
        "feedback": feedback,
        "persistence": persistence_for_interaction(ctx.tenant, interaction=interaction),
        "tokens": tokens,
        "adapter": adapter,
        "reward": reward,
        "version": interaction.adapter_version,
    }
    return tenant_render(request, ctx, "dashboard/interactions/detail.html", context, section="interactions")


def _conversation(interaction: Interaction) -> list[dict[str, Any]]:
    """The messages of a chat interaction as the page shows them: role, text, tool calls."""
    shown = []
    for message in interaction.messages or []:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(part.get("text", "") for part in content if isinstance(part, dict))
        shown.append(
            {
                "role": message.get("role", ""),
                "text": content or "",
                "tool_calls": message.get("tool_calls") or [],
                "tool_call_id": message.get("tool_call_id", ""),
            }
        )
    return shown
