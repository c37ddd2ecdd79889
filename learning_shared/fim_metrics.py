"""How close a FIM completion is to the reference middle: exact match and edit similarity.

Pure Python and a leaf of the package (it imports nothing else of it): GRPO's reward, the
gate's FIM check and ``score`` all use it, and importing it costs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence


def edit_similarity(candidate: str, reference: str) -> float:
    """1 − Levenshtein distance / length of the longer string (1.0 for two empty strings)."""
    if candidate == reference:
        return 1.0
    if len(candidate) < len(reference):
        candidate, reference = reference, candidate
    previous = list(range(len(reference) + 1))
    for i, c in enumerate(candidate, start=1):
        current = [i]
        for j, r in enumerate(reference, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (c != r)))
        previous = current
    return 1.0 - previous[-1] / max(len(candidate), 1)


def exact_match(candidate: str, reference: str) -> bool:
    """The same text, trailing whitespace aside."""
    return candidate.rstrip() == reference.rstrip()


def mean_scores(candidates: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean exact match and edit similarity of ``candidates`` to their ``references``."""
    exact, similarity = 0, 0.0
    for candidate, reference in zip(candidates, references, strict=True):
        exact += exact_match(candidate, reference)
        similarity += edit_similarity(candidate, reference)
    return {"exact_match": exact / len(references), "edit_similarity": similarity / len(references)}
