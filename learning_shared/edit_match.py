"""Where a text went: the stretch of a later text closest to it by edit distance.

Sellers' approximate matching (the start and end of the stretch are free, so the later text may hold
more than the stretch), computed with Myers' bit-parallel algorithm: one machine-word step per
character of the text for each 64 characters of the pattern (Python's integers hold the whole
column). Pure and torch-free: Strop measures persistence reports with it
(``apps.interactions.retention``), and the learning benchmark's simulated developers are measured
the same way (``benchmarks/simdev/persistence.py``).
"""

from __future__ import annotations

from learning_shared.credit import persisted_chars


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


def found_chars(accepted: str, reported: str) -> int:
    """Characters of ``accepted`` found in ``reported``, in order, in the stretch closest to it (in
    runs of at least 3: ``learning_shared.credit.persisted_chars``); no cap on the lengths."""
    stretch = matched_stretch(accepted, reported) if accepted else ""
    return sum(persisted_chars(accepted, stretch)) if stretch else 0
