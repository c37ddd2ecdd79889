"""The closed sets of values the API takes, as ``Literal`` types, so a type checker and an editor
catch ``outcome="accpeted"`` before the API does. The server is the authority: tests/sdk checks
these against ``Feedback.Outcome``, ``ALL_SCOPES`` and the experiments' ``METRICS``."""

from __future__ import annotations

from typing import Literal

__all__ = ["Metric", "Outcome", "Scope"]

Outcome = Literal[
    "accepted",
    "rejected",
    "not_shown",
    "edited",
    "partial",
    # agents: what the user did with an answer or a session
    "thumbs_up",
    "thumbs_down",
    "edit_persisted",
    "edit_reverted",
    "follow_up_dissatisfied",
    "tool_call_failed",
]
"""What the user did with a completion or an agent's turn (``feedback.send``, ``enqueue``,
``session_outcome``)."""

Scope = Literal["ingest", "feedback", "serve", "admin", "editor"]
"""What an API key may do: log interactions, send feedback, serve completions, manage the
tenant, or be an editor plugin's key (completions and feedback on them only) (``keys.create``)."""

Metric = Literal[
    "accept_rate",
    "accepted_per_request",
    "dissatisfied_rate",
    "error_rate",
    "positive_rate",
    "positive_session_rate",
    "retained_chars_per_request",
    "retained_share",
    "reward_per_request",
    "slow_request_share",
    "suggestion_rate",
]
"""What an experiment compares its arms on: its ``primary_metric`` and its ``guardrails``
(``experiments.create``)."""
