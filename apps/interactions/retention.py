"""How much of an accepted completion survives in the text a client reports later: retained
characters, found by edit distance.

Two steps. Where: the stretch of the reported text closest to the accepted text by edit distance
(the fewest insertions, deletions and substitutions; its start and end there are free: Sellers'
approximate matching), so a client may send the lines at the insertion point or more. What: the
characters of the accepted text found in that stretch, in order, in runs of at least 3 characters
(``learning_shared.credit.persisted_chars``, the rule training credits kept text by), so letters that
line up by chance with unrelated code count for nothing. An untouched completion keeps every
character; one deleted keeps none (or next to none); an edit costs the characters it touched.

The distance is computed with Myers' bit-parallel algorithm (one machine-word step per reported
character for each 64 accepted ones: Python's integers hold the whole column): a 2,000-character
completion not found as is took 0.12 s against 100,000 random characters on the shared 2-core
development machine (2026-11-27), the work growing with both lengths. Inputs are capped, so one request's
work is bounded: reported text by the validator (``MAX_REPORTED_TEXT`` per report, ``MAX_BATCH_TEXT``
per batch), accepted text here (``MAX_MEASURED``: its first characters are measured and the share
found is applied to its whole length).
"""

from __future__ import annotations

from learning_shared.credit import persisted_chars

MAX_REPORTED_TEXT = 20_000  # characters of one report's text (the lines around the insertion point)
MAX_BATCH_TEXT = 2_000_000  # characters of text in one batch of reports (a 413 beyond: split it)
MAX_MEASURED = 2_000  # characters of accepted text measured; a longer completion is measured by its start


def _scan(pattern: str, text: str, *, anchored: bool) -> tuple[int, int]:
    """(the least edit distance between ``pattern`` and a stretch of ``text`` ending at some
    position, the first end position where it is reached). The stretch may start anywhere, or only
    at 0 when ``anchored``."""
    m = len(pattern)
    mask = (1 << m) - 1
    high = 1 << (m - 1)
    peq: dict[str, int] = {}
    for i, char in enumerate(pattern):
        peq[char] = peq.get(char, 0) | (1 << i)
    pv, mv, score, best, best_end = mask, 0, m, m, 0
    carry = 1 if anchored else 0  # anchored: the top row grows by one per character, as in plain Levenshtein
    for position, char in enumerate(text, start=1):
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
                best, best_end = score, position
                if best == 0:
                    break
        # Unanchored, a match may start anywhere in the text: the top row stays 0, nothing is shifted in.
        ph = ((ph << 1) | carry) & mask
        mh = (mh << 1) & mask
        pv = mh | (~(xv | ph) & mask)
        mv = ph & xv
    return best, best_end


def approximate_match_distance(pattern: str, text: str) -> int:
    """The edit distance between ``pattern`` and the stretch of ``text`` closest to it (0 when the
    pattern occurs in the text; ``len(pattern)`` at most, when nothing of it is there)."""
    if not pattern or pattern in text:  # the common case for a kept completion: one C-level scan
        return 0
    return _scan(pattern, text, anchored=False)[0]


def matched_stretch(pattern: str, text: str) -> str:
    """The stretch of ``text`` closest to ``pattern`` (what is left of it there, edits included;
    empty when nothing is): the end from a forward scan, the start from a scan of the reversed text
    anchored at that end. At most ``len(pattern)`` + the distance characters."""
    if not pattern:
        return ""
    found = text.find(pattern)
    if found >= 0:
        return pattern
    distance, end = _scan(pattern, text, anchored=False)
    if distance == len(pattern):
        return ""
    # The stretch is at most len(pattern) + distance characters: scan no further back than that.
    _, length = _scan(pattern[::-1], text[max(0, end - len(pattern) - distance) : end][::-1], anchored=True)
    return text[end - length : end]


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
    kept = sum(persisted_chars(measured, stretch)) if stretch else 0
    if len(measured) != len(accepted):
        kept = round(kept * len(accepted) / len(measured))
    return kept, stretch


def retained_from_ratio(accepted_chars: int, ratio: float) -> int:
    """Retained characters from a share the client measured itself (0 to 1)."""
    return max(0, min(accepted_chars, round(ratio * accepted_chars)))
