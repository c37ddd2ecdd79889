"""How close a FIM completion is to the reference middle: its first line, the whole middle
exactly, and edit similarity.

Pure Python and a leaf of the package (it imports nothing else of it): GRPO's reward, the
gate's FIM check and ``score`` all use it, and importing it costs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


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


def first_line(text: str) -> str:
    """The first line holding more than whitespace, its runs of whitespace made one space: what a
    developer who takes one line at a time sees and accepts."""
    for line in text.split("\n"):
        if line.strip():
            return " ".join(line.split())
    return ""


def starts_on_the_cursors_line(text: str) -> bool:
    """Whether ``text`` puts something on the line the cursor is on (else it opens a new line first)."""
    return bool(text.split("\n", 1)[0].strip())


def first_line_match(candidate: str, reference: str) -> bool:
    """The same first line, whitespace aside, on the same line: a completion that writes on the
    cursor's line what belongs on the next one is wrong code (an empty middle matches an empty
    completion)."""
    return (first_line(candidate) == first_line(reference)
            and starts_on_the_cursors_line(candidate) == starts_on_the_cursors_line(reference))


@dataclass(frozen=True)
class CaseScore:
    """One completion against its reference middle."""

    first_line: bool
    """``first_line_match``: offline, a single-line developer would have accepted it."""
    exact: bool
    """``exact_match`` of the whole middle."""
    similarity: float
    """``edit_similarity`` to the whole middle."""


def case_scores(candidates: Sequence[str], references: Sequence[str]) -> list[CaseScore]:
    """Each candidate scored against its reference, in order."""
    return [
        CaseScore(first_line_match(c, r), exact_match(c, r), edit_similarity(c, r))
        for c, r in zip(candidates, references, strict=True)
    ]


def means(scores: Sequence[CaseScore]) -> dict[str, float]:
    """Mean exact match and edit similarity over ``scores`` (not empty)."""
    return {
        "exact_match": sum(s.exact for s in scores) / len(scores),
        "edit_similarity": sum(s.similarity for s in scores) / len(scores),
    }


def mean_scores(candidates: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """Mean exact match and edit similarity of ``candidates`` to their ``references``."""
    return means(case_scores(candidates, references))
