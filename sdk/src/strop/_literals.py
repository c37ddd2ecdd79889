"""The closed sets of values the API takes, as ``Literal`` types, so a type checker and an editor
catch ``outcome="accpeted"`` before the API does. The server is the authority: tests/sdk checks
these against ``Feedback.Outcome`` and ``ALL_SCOPES``."""

from __future__ import annotations

from typing import Literal

__all__ = ["Outcome", "Scope"]

Outcome = Literal[
    "accepted",
    "rejected",
    "not_shown",
    "edited",
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

Scope = Literal["ingest", "feedback", "serve", "admin"]
"""What an API key may do: log interactions, send feedback, serve completions, manage the
tenant (``keys.create``)."""
