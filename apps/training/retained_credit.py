"""Token-level credit for what stayed: an accepted completion credited from its persistence reports
when the policy says so (``TrainingPolicy.credit_retained``).

The latest checkpoint reported for the interaction says what was kept: its ``kept_text`` (the
stretch of the reported text where the completion was found) credits the served tokens as an
agent's ``edit_persisted`` credits an answer (``learning_shared.credit.persisted_token_rewards``):
each token whose characters all stayed earns ``reward_accepted``, the others 0. A completion
deleted by then (nothing retained) earns 0 on every token rather than the accept's full reward. No
report, one that carried only a ratio (no text to align tokens with), or an accepted text longer
than ``MAX_MEASURED`` (only its start is aligned, so ``kept_text`` says nothing of the rest) leaves
the accept's one scalar reward."""

from __future__ import annotations

from typing import Any

from apps.interactions.models import Feedback, PersistenceReport
from apps.interactions.retention import MAX_MEASURED
from learning_shared.credit import persisted_token_rewards


def latest_report(feedback: Feedback) -> PersistenceReport | None:
    """The report at the latest checkpoint of the feedback's interaction (the prefetched rows when
    the export prefetched them: no query per event)."""
    if feedback.interaction is None:
        return None
    reports = [r for r in feedback.interaction.persistence_reports.all() if r.retained_chars is not None]
    return max(reports, key=lambda r: r.checkpoint_s, default=None)


def retained_token_rewards(
    feedback: Feedback, *, completion_token_ids: list[int], tokenizer: Any, reward_accepted: float
) -> list[float] | None:
    """Per served token, ``reward_accepted`` where its characters stayed, 0 elsewhere; None where the
    accept keeps its scalar reward (not an accept, no report, a report without text, or an accepted
    text longer than the measure aligns)."""
    if feedback.outcome != Feedback.Outcome.ACCEPTED or not completion_token_ids:
        return None
    report = latest_report(feedback)
    if report is None or report.reported_ratio is not None:
        return None
    if (report.accepted_chars or 0) > MAX_MEASURED:
        return None  # only its start was aligned (kept_text): the rest would earn 0 though it stayed
    reward = reward_accepted * feedback.reward_weight
    if not report.retained_chars or not report.kept_text:
        return [0.0] * len(completion_token_ids)
    credit = persisted_token_rewards(
        completion_token_ids, report.kept_text, tokenizer=tokenizer, persisted_reward=reward
    )
    return credit if credit is not None else [0.0] * len(completion_token_ids)
