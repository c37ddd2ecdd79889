"""How much of an accepted completion survives in the text a client reports later: retained
characters by edit distance.

The accepted text is matched against the best place in the reported text (its start and end there
are free), so a client may send the whole document or just the lines at the insertion point:
``retained = accepted − distance``, where ``distance`` is the fewest insertions, deletions and
substitutions that turn the accepted text into some stretch of the reported one (Sellers' approximate
matching). An untouched completion keeps every character; one deleted keeps none; an edit costs the
characters it touched.

The distance is computed with Myers' bit-parallel algorithm (one machine-word step per reported
character for each 64 accepted ones: Python's integers hold the whole column), so a 2,000-character
completion in a 100,000-character document is measured in well under a second. Inputs are capped:
reported text by the validator (``MAX_REPORTED_TEXT``), accepted text here (``MAX_MEASURED``, its
first characters are measured and the share found is applied to its whole length).
"""

from __future__ import annotations

MAX_REPORTED_TEXT = 100_000  # characters of reported text (a document); longer is refused with a 400
MAX_MEASURED = 4_000  # characters of accepted text measured; a longer completion is measured by its start


def approximate_match_distance(pattern: str, text: str) -> int:
    """The edit distance between ``pattern`` and the stretch of ``text`` closest to it (0 when the
    pattern occurs in the text; ``len(pattern)`` at most, when nothing of it is there)."""
    m = len(pattern)
    if m == 0:
        return 0
    if pattern in text:  # the common case for a kept completion: one C-level scan
        return 0
    mask = (1 << m) - 1
    high = 1 << (m - 1)
    peq: dict[str, int] = {}
    for i, char in enumerate(pattern):
        peq[char] = peq.get(char, 0) | (1 << i)
    pv, mv, score, best = mask, 0, m, m
    for char in text:
        eq = peq.get(char, 0)
        xv = eq | mv
        xh = ((((eq & pv) + pv) & mask) ^ pv) | eq
        ph = mv | (~(xh | pv) & mask)
        mh = pv & xh
        if ph & high:
            score += 1
        elif mh & high:
            score -= 1
            if score < best:
                best = score
                if best == 0:
                    return 0
        # A match may start anywhere in the text: the top row stays 0, so nothing is shifted in.
        ph = (ph << 1) & mask
        mh = (mh << 1) & mask
        pv = mh | (~(xv | ph) & mask)
        mv = ph & xv
    return best


def retained_chars(accepted: str, reported: str) -> int:
    """Characters of ``accepted`` still found in ``reported`` (0 to ``len(accepted)``)."""
    if not accepted:
        return 0
    measured = accepted[:MAX_MEASURED]
    kept = len(measured) - approximate_match_distance(measured, reported)
    if len(measured) == len(accepted):
        return kept
    return round(kept * len(accepted) / len(measured))


def retained_from_ratio(accepted_chars: int, ratio: float) -> int:
    """Retained characters from a share the client measured itself (0 to 1)."""
    return max(0, min(accepted_chars, round(ratio * accepted_chars)))
