"""What a simulated developer's accepted code becomes over time, measured as Strop measures it
(``learning_shared.edit_match``, the edit distance behind persistence reports).

By the last checkpoint (10 minutes after the accept) the developer has made the code what they meant
to type: what equals it stays, what is close to it is edited into it, what has no place in it is
deleted. So the text at the insertion point is what they meant, and the retained characters of an
accepted suggestion are its characters less its distance from that text. The accepted text is the
suggestion for ``accepted`` and ``edited`` (taken whole, then fixed), the characters taken for
``partial``; nothing for the other outcomes.
"""

from __future__ import annotations

from learning_shared.edit_match import found_chars

CHECKPOINT_S = 600  # the last checkpoint the SDK's tracker reports


def accepted_text(outcome: str, suggestion: str, accepted_chars: int | None) -> str:
    """The characters of ``suggestion`` the developer put into their file at the accept."""
    if outcome in ("accepted", "edited"):
        return suggestion.rstrip()
    if outcome == "partial" and accepted_chars:
        return suggestion[:accepted_chars]
    return ""


def retained_at_last_checkpoint(
    outcome: str, suggestion: str, accepted_chars: int | None, meant: str
) -> tuple[int, int]:
    """(accepted characters, of them the characters still there at ``CHECKPOINT_S``)."""
    accepted = accepted_text(outcome, suggestion, accepted_chars)
    return len(accepted), found_chars(accepted, meant.rstrip())
