"""How much of an accepted completion survives in the text a client reports later: retained
characters, found by edit distance.

Two steps. Where: the stretch of the reported text closest to the accepted text by edit distance
(the fewest insertions, deletions and substitutions; its start and end there are free: Sellers'
approximate matching), so a client may send the lines at the insertion point or more. What: the
characters of the accepted text found in that stretch, in order, in runs of at least 3 characters
(``learning_shared.credit.persisted_chars``, the rule training credits kept text by), so letters that
line up by chance with unrelated code count for nothing. An untouched completion keeps every
character; one deleted keeps none (or next to none); an edit costs the characters it touched. A
completion shorter than a run (one or two characters) counts whole where the stretch holds it: at
that length a copy left and a chance match cannot be told apart.

The match (``learning_shared.edit_match``) uses Myers' bit-parallel algorithm, its work growing
with both lengths (the results log has its timing). Inputs are capped, so one request's
work is bounded: reported text by the validator (``MAX_REPORTED_TEXT`` per report, ``MAX_BATCH_TEXT``
per batch), accepted text here (``MAX_MEASURED``: its first characters are measured and the share
found is applied to its whole length).
"""

from __future__ import annotations

from learning_shared.credit import MIN_PERSISTED_RUN, persisted_chars
from learning_shared.edit_match import matched_stretch

MAX_REPORTED_TEXT = 20_000  # characters of one report's text (the lines around the insertion point)
MAX_BATCH_TEXT = 2_000_000  # characters of text in one batch of reports (a 413 beyond: split it)
MAX_MEASURED = 2_000  # characters of accepted text measured; a longer completion is measured by its start


def retained_chars(accepted: str, reported: str) -> int:
    """Characters of ``accepted`` still found in ``reported`` (0 to ``len(accepted)``)."""
    return retention_measure(accepted, reported)[0]


def retention_measure(accepted: str, reported: str) -> tuple[int, str]:
    """(characters of ``accepted`` still found in ``reported``, the stretch of ``reported`` they are
    in: what training credits token by token)."""
    if not accepted:
        return 0, ""
    measured = accepted[:MAX_MEASURED]
    stretch = matched_stretch(measured, reported)
    # A completion shorter than a run (")", "];") counts whole where it is found: no run of 3 exists.
    kept = sum(persisted_chars(measured, stretch, min_run=min(MIN_PERSISTED_RUN, len(measured)))) if stretch else 0
    if len(measured) != len(accepted):
        kept = round(kept * len(accepted) / len(measured))
    return kept, stretch


def retained_from_ratio(accepted_chars: int, ratio: float) -> int:
    """Retained characters from a share the client measured itself (0 to 1)."""
    return max(0, min(accepted_chars, round(ratio * accepted_chars)))
