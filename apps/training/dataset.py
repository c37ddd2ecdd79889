"""Turn a run's window of interactions + feedback into trainer samples.

Served interactions carry the exact token ids and behaviour logprobs vLLM produced, and the
trainer learns on exactly those tokens. Logged ones without usable ids are tokenized with the
base model's tokenizer (no behaviour logprobs then: the trainer treats them as on-policy); an
empty list of prompt ids (refused at ingest now, but stored by older versions) is no ids.

One event no sample can be built from never fails its window: it is left out of the samples,
named in the operator's log and the run's (``Window.left_out``), and recorded in the window as
held out (looked at, never learned), so it does not count as new and start run after run.

A partial accept or an edit says which tokens the user kept, so its sample also carries
``token_rewards``, one per completion token (``feedback_credit``): the kept prefix earns the
policy's accepted reward token by token, the first token the user did not keep its rejected
reward, the rest 0. An agent's ``edit_persisted`` that sends ``kept_text`` (the code still in the
file) says the same of its answer: the tokens that persisted earn ``reward_edit_persisted``, the
others 0. The sample's scalar ``reward`` stays the policy's for the outcome (``reward_partial``,
``reward_edited``, ``reward_edit_persisted``): the batch baseline, the silent counterfactual, the
gate's off-policy estimate and the experiments all read that one. An edit's sample also carries its
``kept_text`` as tokens (``preferred_token_ids``), which the trainer's pairwise loss prefers to the
completion when ``preference_coef`` is on. With the policy's ``credit_retained`` on, an accept
with a persistence report is credited by what stayed (``apps.training.retained_credit``).
"""

from __future__ import annotations

import functools
import json
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import jinja2
from django.db import connection, transaction

from apps.adapters.models import BaseModel
from apps.common.exception_handler import public_text
from apps.interactions.models import SHOWN_OUTCOMES, Feedback, Interaction
from apps.interactions.rewards import reward_value
from apps.training.models import TrainingPolicy, TrainingRun, TrainingRunEvent
from apps.training.retained_credit import retained_token_rewards
from apps.training.selectors import training_window_events
from learning_shared.chat import chat_completion_text, chat_prompt_ids
from learning_shared.credit import CREDITED_OUTCOMES, EventCredit, event_credit
from learning_shared.fim import build_fim_prompt
from learning_shared.samples import Sample
from learning_shared.show_filter import SHOW_ACCEPTED, ShowEvent, suggestion_score

logger = logging.getLogger(__name__)

# What building one event's sample raises when that event's data cannot make one (a template that
# cannot render its messages included); never an OSError, a DatabaseError or a MemoryError.
_EVENT_DATA_ERRORS = (ValueError, TypeError, LookupError, jinja2.TemplateError)


@dataclass
class Window:
    train: list[Sample] = field(default_factory=list)
    heldout: list[Sample] = field(default_factory=list)
    # Every shown completion Strop served in the window's training part, scored: what the show filter
    # is fitted on (never the held-out part, on which the eval gate judges the version with it).
    show_events: list[ShowEvent] = field(default_factory=list)
    # Events no sample could be built from, one line each ("interaction <id>: why"): not trained on
    # and not held out for the gate, recorded in the window as held out.
    left_out: list[str] = field(default_factory=list)


def _event(
    run: TrainingRun, feedback: Feedback, *, held_out: bool, reward: float, left_out: bool = False
) -> TrainingRunEvent:
    """The window's row for ``feedback``, with its label as read (another label is learned again)."""
    return TrainingRunEvent(
        run=run, feedback=feedback, held_out=held_out, reward=reward, outcome=feedback.outcome, left_out=left_out
    )


def _interaction(feedback: Feedback) -> Interaction:
    """The interaction of a window's event: pending feedback (none yet) is never in a window."""
    interaction = feedback.interaction
    if interaction is None:
        raise ValueError(f"feedback {feedback.pk} has no interaction: pending feedback is never in a training window")
    return interaction


def show_event(feedback: Feedback) -> ShowEvent | None:
    """The show filter's view of one event: a completion Strop served (its own logprobs) that the
    user saw, or None."""
    interaction = _interaction(feedback)
    logprobs = interaction.completion_logprobs
    if (
        interaction.source != Interaction.Source.SERVED
        or interaction.messages is not None
        or not interaction.completion.strip()
        or not logprobs
        or feedback.outcome not in SHOWN_OUTCOMES
    ):
        return None
    weight = float(((interaction.metadata or {}).get("show_gate") or {}).get("weight", 1.0))
    # Grouped by end user: the fit checks itself on users it was not fitted on (learning_shared.show_filter).
    return ShowEvent(
        score=suggestion_score(logprobs),
        accepted=feedback.outcome in SHOW_ACCEPTED,
        weight=weight,
        group=interaction.end_user_id or "",
    )


@functools.cache
def _tokenizer(model_dir: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@functools.cache
def _vocab_size(model_dir: str) -> int:
    return int(json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"])


def _ids_fit(ids: list[int] | None, vocab_size: int) -> TypeGuard[list[int]]:
    return ids is not None and all(0 <= t < vocab_size for t in ids)


def _silent(interaction: Interaction) -> bool:
    """The model showed nothing: no text, and (chat) no tool call."""
    return not interaction.completion.strip() and not (interaction.metadata or {}).get("tool_calls")


def feedback_credit(
    feedback: Feedback, *, completion_token_ids: list[int], base: BaseModel, policy: TrainingPolicy
) -> EventCredit:
    """What the event says token by token (``learning_shared.credit.event_credit``): a partial
    accept's or an edit's kept prefix, an ``edit_persisted``'s persisted text (``token_rewards``,
    scaled like its scalar reward by the row's weight) and an edit's kept text as tokens
    (``preferred_token_ids``). The tokenizer is loaded only for the outcomes that carry credit."""
    if policy.credit_retained and feedback.outcome == Feedback.Outcome.ACCEPTED and completion_token_ids:
        retained = retained_token_rewards(
            feedback,
            completion_token_ids=completion_token_ids,
            tokenizer=_tokenizer(base.path),
            reward_accepted=policy.reward_accepted,
        )
        if retained is not None:
            return EventCredit(token_rewards=retained)
    if feedback.outcome not in CREDITED_OUTCOMES:
        return EventCredit()
    weight = feedback.reward_weight
    return event_credit(
        feedback.outcome,
        _interaction(feedback).completion,
        completion_token_ids,
        accepted_chars=feedback.accepted_chars,
        kept_text=feedback.kept_text,
        tokenizer=_tokenizer(base.path),
        kept_reward=policy.reward_accepted * weight,
        rejected_reward=policy.reward_rejected * weight,
        persisted_reward=policy.reward_edit_persisted * weight,
    )


def interaction_to_sample(
    interaction: Interaction,
    *,
    base: BaseModel,
    reward: float,
    silence_reward: float | None = None,
    credit: EventCredit | None = None,
) -> Sample:
    """One trainer sample; ``silence_reward`` goes with an agent's turn (what an empty answer
    earns), ``credit`` with an event that says which tokens were kept."""
    return _sample(
        interaction,
        _tokens(interaction, base=base),
        reward=reward,
        silence_reward=silence_reward,
        credit=credit or EventCredit(),
    )


Tokens = tuple[list[int], list[int], list[float] | None]


def _sample(
    interaction: Interaction, tokens: Tokens, *, reward: float, silence_reward: float | None, credit: EventCredit
) -> Sample:
    prompt_ids, completion_ids, logprobs = tokens
    return Sample.build(
        id=str(interaction.pk),
        prompt_token_ids=prompt_ids,
        completion_token_ids=completion_ids,
        behaviour_logprobs=logprobs,
        reward=reward,
        silent=_silent(interaction),
        silence_reward=silence_reward if interaction.messages is not None else None,
        token_rewards=credit.token_rewards,
        preferred_token_ids=credit.preferred_token_ids,
        where=f"interaction {interaction.pk}",
    )


def _tokens(interaction: Interaction, *, base: BaseModel) -> Tokens:
    """The prompt's and the completion's token ids and the completion's behaviour logprobs: as
    served where the ids fit the base model, else tokenized from the text (no logprobs then)."""
    vocab = _vocab_size(base.path)
    # No prompt has zero tokens: an empty list (stored before ingest refused it) is no ids, and the
    # prompt is tokenized from its text. An empty completion is the "stay silent" action: it fits.
    prompt_ids = interaction.prompt_token_ids or None
    completion_ids = interaction.completion_token_ids
    logprobs = interaction.completion_logprobs
    # A reply that made tool calls wrote tokens: no ids for it (stored by older versions) are no ids.
    tool_calls = interaction.messages is not None and bool((interaction.metadata or {}).get("tool_calls"))
    if tool_calls and not completion_ids:
        completion_ids = None
    if _ids_fit(prompt_ids, vocab) and _ids_fit(completion_ids, vocab):
        if logprobs is not None and len(logprobs) != len(completion_ids or []):
            logprobs = None
        return prompt_ids, completion_ids, logprobs
    tokenizer = _tokenizer(base.path)
    if interaction.messages is not None:  # a conversation, rendered with the base's chat template as vLLM does
        prompt_ids = chat_prompt_ids(tokenizer, base.path, interaction.messages, interaction.tools)
    else:
        # A FIM request is framed as the base frames it, whatever convention (or OpenAI's insert form)
        # its ``prompt`` was sent in; a plain prompt as it was sent.
        fim = interaction.prefix or interaction.suffix or not interaction.prompt
        prompt = build_fim_prompt(base.family, interaction.prefix, interaction.suffix) if fim else interaction.prompt
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    # Ids from another tokenizer (a model served elsewhere) are useless here: tokenize the text.
    if not _ids_fit(completion_ids, vocab):
        return prompt_ids, tokenizer.encode(_completion_text(interaction), add_special_tokens=False), None
    return prompt_ids, completion_ids, logprobs


def _completion_text(interaction: Interaction) -> str:
    """What the model wrote: an agent's reply with its tool calls rendered as a served one's tokens
    hold them (never the empty "stay silent" action), any other completion as it is."""
    tool_calls = (interaction.metadata or {}).get("tool_calls")
    if interaction.messages is None or not tool_calls:
        return interaction.completion
    return chat_completion_text(interaction.completion, tool_calls)


def _window_lock(run: TrainingRun) -> None:
    """Held until the window is committed: an erase meanwhile (it locks the tenant's active runs
    FOR UPDATE) waits for it, and then finds its events (apps.training.erasure). KEY SHARE, so the
    run's own heartbeat and status updates go on. SQLite has no row locks: its writers take turns."""
    if connection.vendor != "postgresql":
        return
    table = connection.ops.quote_name(TrainingRun._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT 1 FROM {table} WHERE id = %s FOR KEY SHARE", [run.pk])


def dataset_export(run: TrainingRun, *, policy: TrainingPolicy, max_events: int | None = None) -> Window:
    """Fix the run's window (recorded as TrainingRunEvent rows) and build its samples.

    Events committed after this moment are not in the window and stay eligible for the next run,
    as do those past ``max_events`` (the oldest are taken first). An event no sample can be built
    from is left out of the samples (``Window.left_out``), not the cause of a failed run.
    """
    base = run.adapter.base_model
    rng = random.Random(f"heldout:{run.pk}")  # a different held-out draw per run: none is held out forever
    window = Window()
    # An agent that answers nothing leaves its user to ask again: its silence is a dissatisfied follow-up.
    agent_silence_reward = policy.reward_follow_up_dissatisfied
    rewards = policy.reward_table()  # once per window, not once per event
    with transaction.atomic():
        _window_lock(run)
        events = training_window_events(run.adapter, parent=run.parent_version, limit=max_events)
        rows = []
        for feedback in events:
            reward = reward_value(rewards, outcome=feedback.outcome, weight=feedback.reward_weight)
            held_out = rng.random() < policy.heldout_fraction
            try:
                interaction = _interaction(feedback)
                tokens = _tokens(interaction, base=base)
                credit = feedback_credit(feedback, completion_token_ids=tokens[1], base=base, policy=policy)
                sample = _sample(interaction, tokens, reward=reward, silence_reward=agent_silence_reward, credit=credit)
            except _EVENT_DATA_ERRORS as exc:  # this event's data, not the window's: a template that cannot render it
                # A ValueError (TrainerInputError included) says what is wrong with the event; the others
                # are named by their type, with the traceback in the operator's log. Anything else (a
                # missing model file, the database, memory) fails the window, which is tried again whole.
                expected = isinstance(exc, ValueError)
                detail = str(exc) if expected else f"cannot be rendered ({type(exc).__name__}: {exc})"
                name, why = f"interaction {feedback.interaction_id}", public_text(detail, max_length=300)
                why = why if why.startswith(name) else f"{name}: {why}"
                logger.warning(
                    "run %s left out an event no sample can be built from: %s", run.pk, why, exc_info=not expected
                )
                window.left_out.append(why)
                rows.append(_event(run, feedback, held_out=True, reward=reward, left_out=True))
                continue
            (window.heldout if held_out else window.train).append(sample)
            scored = None if held_out else show_event(feedback)
            if scored is not None:
                window.show_events.append(scored)
            rows.append(_event(run, feedback, held_out=held_out, reward=reward))
        TrainingRunEvent.objects.bulk_create(rows)
    return window
