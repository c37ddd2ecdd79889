"""Session outcomes of agents: how a conversation ended, spread over its turns as feedback.

The rule (documented in docs/agents.md, "Agents"): an outcome names the turn it follows, ``T``.
Turn ``T`` gets the outcome at weight 1, each earlier turn ``t`` at ``discount ** (T - t)``
(``discount`` 0: turn ``T`` alone), later turns nothing. The weight multiplies the outcome's
reward in the adapter's policy. A spread row is a Feedback row marked with its session outcome:
training, the dashboard and experiments read it like any feedback. A turn's own feedback always
replaces a spread one, and a spread never replaces a turn's own feedback. Turns that arrive after
the outcome get it when they are stored; a newer outcome for the session re-spreads.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from django.db import transaction

from apps.common.lookups import in_values
from apps.interactions.models import ConversationOutcome, Feedback, Interaction
from apps.interactions.rows import interactions_held
from apps.interactions.validation import FeedbackIn
from apps.tenants.models import Tenant


def conversation_outcome_record(tenant: Tenant, *, item: FeedbackIn, now: datetime) -> int:
    """Store a session outcome (last write wins by ``occurred_at``) and spread it over the turns
    stored so far. Returns how many turns it was written to (a turn whose own feedback came in
    meanwhile, and kept it, may be counted)."""
    assert item.conversation_id is not None
    occurred_at = item.occurred_at or now
    with transaction.atomic():
        outcome, created = ConversationOutcome.objects.select_for_update().get_or_create(
            tenant=tenant,
            conversation_id=item.conversation_id,
            defaults={
                "turn": item.turn,
                "outcome": item.outcome,
                "discount": item.discount,
                "occurred_at": occurred_at,
                "received_at": now,
                "updated_at": now,
                "metadata": item.metadata,
            },
        )
        if not created:
            outcome.events_received += 1
            outcome.updated_at = now
            if occurred_at >= outcome.occurred_at:
                outcome.turn, outcome.outcome, outcome.discount = item.turn, item.outcome, item.discount
                outcome.occurred_at, outcome.metadata = occurred_at, item.metadata
            outcome.save()
        return _spread(tenant, outcome, now=now)


def conversation_outcomes_apply(tenant: Tenant, *, conversation_ids: Iterable[str], now: datetime) -> int:
    """Spread the sessions' outcomes that arrived before some of their turns (called when turns are
    stored). Returns how many turns one was written to (as :func:`conversation_outcome_record`)."""
    ids = list(conversation_ids)
    # One transaction (a served chat turn calls this on its own, outside any): each outcome locked,
    # then its turns' feedback, the order recording an outcome takes them.
    with transaction.atomic():
        outcomes = (
            ConversationOutcome.objects.select_for_update()
            .filter(tenant=tenant, **in_values("conversation_id", ids))
            .order_by("pk")
        )
        return sum(_spread(tenant, outcome, now=now) for outcome in outcomes)


def _spread(tenant: Tenant, outcome: ConversationOutcome, *, now: datetime) -> int:
    turns = [
        (pk, turn)
        for pk, turn in Interaction.objects.filter(
            tenant=tenant, conversation_id=outcome.conversation_id, turn__isnull=False
        ).values_list("id", "turn")
        if turn is not None
    ]
    # The turns held until the spread rows are written: one an erase or retention deleted meanwhile
    # gets none (apps.interactions.rows.interactions_held).
    held = interactions_held(tenant.pk, {pk for pk, _ in turns})
    turns = sorted((pk, turn) for pk, turn in turns if pk in held)
    if not turns:
        return 0
    existing = {
        f.interaction_id: f
        for f in Feedback.objects.select_for_update()
        .filter(tenant=tenant, interaction_id__in=[pk for pk, _ in turns])
        .order_by("interaction_id")  # in the order a feedback batch upserts them (services.feedback)
    }
    spread, new = 0, []
    for interaction_id, turn in turns:
        weight = outcome.weight_for(turn)
        feedback = existing.get(interaction_id)
        if feedback is not None and feedback.session_outcome_id is None:
            continue  # the turn's own feedback wins
        if weight == 0.0:
            if feedback is not None:  # an earlier version of this outcome named a later turn
                feedback.delete()
            continue
        if feedback is None:
            feedback = Feedback(tenant=tenant, interaction_id=interaction_id, received_at=now, events_received=0)
            new.append(feedback)
        feedback.outcome, feedback.reward_weight, feedback.session_outcome = outcome.outcome, weight, outcome
        feedback.occurred_at, feedback.updated_at = outcome.occurred_at, now
        feedback.metadata = {"session_outcome": {"turn": outcome.turn, "discount": outcome.discount}}
        if feedback.pk is not None:
            feedback.save()
            spread += 1
    if new:
        # The lock above holds only rows that existed: the turn's own feedback may be inserted meanwhile
        # (a served chat turn's, an upsert that does not wait for this one). On that conflict it wins and
        # the spread row is not written (ON CONFLICT DO NOTHING), rather than failing the whole spread.
        Feedback.objects.bulk_create(new, ignore_conflicts=True)
        spread += len(new)
    return spread
