"""How a simulated developer answers a suggestion: pure functions, no I/O.

A suggestion is *shown* when it holds something visible: an empty or whitespace-only text is
nothing to show, so the outcome is ``not_shown`` (reward 0), never a rejection. A shown
suggestion is accepted when it is what the developer would have typed, otherwise rejected.
Trailing whitespace of a suggestion (spaces, tabs, line breaks) is ignored: it changes no code.

Two populations, each a tenant with its own taste:

* ``line`` — accepts only a **single-line** suggestion whose text **equals the rest of the
  line** after whitespace normalisation (leading and trailing blanks dropped, every run of
  blanks inside read as one space). Exact match, no similarity threshold. A suggestion that
  spans several lines is rejected even when its first line is right.
* ``block`` — accepts a suggestion of k lines, with k at most the lines of the block (the rest
  of the line and the following lines of the same block, see ``tasks``), when its first line
  equals the rest of the line (as above), its k lines have an edit similarity of at least 0.9
  to the block's first k lines, and it has at least two lines unless the block is the one line
  (a right single line is accepted only where the line ends its block). Lines after the first
  keep their indentation (it is Python's syntax); only their trailing blanks and inner runs of
  blanks are normalised. Edit similarity = 1 − Levenshtein distance / length of the longer text.
"""

from __future__ import annotations

from typing import Literal

from .tasks import Population, Task

Outcome = Literal["accepted", "rejected", "not_shown"]
POPULATIONS: tuple[Population, ...] = ("line", "block")
BLOCK_MIN_SIMILARITY = 0.9
# The tenants' default reward policy (Cursor's Tab RL): what the summaries report.
REWARDS: dict[str, float] = {"accepted": 0.75, "rejected": -0.25, "not_shown": 0.0}


def is_shown(suggestion: str) -> bool:
    return bool(suggestion.strip())


def normalise_line(text: str, *, keep_indent: bool = False) -> str:
    """Trailing blanks dropped, inner runs of blanks as one space; leading blanks dropped unless
    ``keep_indent``."""
    body = " ".join(text.split())
    if keep_indent and body:
        return text[: len(text) - len(text.lstrip())].expandtabs(4) + body
    return body


def edit_similarity(a: str, b: str) -> float:
    """1 − Levenshtein(a, b) / max(len(a), len(b)); 1.0 for two empty texts."""
    if a == b:
        return 1.0
    if len(a) < len(b):
        a, b = b, a
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, start=1):
        current = [i]
        for j, char_b in enumerate(b, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b)))
        previous = current
    return 1.0 - previous[-1] / len(a)


def line_accepts(suggestion: str, line_rest: str) -> bool:
    """The ``line`` developer: one line, equal to the rest of the line."""
    text = suggestion.rstrip()
    return bool(text) and "\n" not in text and normalise_line(text) == normalise_line(line_rest)


def block_accepts(suggestion: str, block: str) -> bool:
    """The ``block`` developer: the rest of the line right, and the suggestion's lines close to the
    block's (edit similarity ≥ 0.9); a single line only where the line ends its block."""
    if not is_shown(suggestion):
        return False
    lines = suggestion.rstrip().split("\n")
    truth = block.rstrip().split("\n")
    if len(lines) > len(truth) or len(lines) < min(len(truth), 2):
        return False
    if normalise_line(lines[0]) != normalise_line(truth[0]):
        return False

    def joined(rows: list[str]) -> str:
        return "\n".join([normalise_line(rows[0]), *(normalise_line(row, keep_indent=True) for row in rows[1:])])

    return edit_similarity(joined(lines), joined(truth[: len(lines)])) >= BLOCK_MIN_SIMILARITY


def decide(population: Population, suggestion: str, task: Task) -> Outcome:
    """What a developer of ``population`` does with ``suggestion`` at ``task``."""
    if population not in POPULATIONS:
        raise ValueError(f"population must be one of {POPULATIONS}, not {population!r}")
    if not is_shown(suggestion):
        return "not_shown"
    if population == "line":
        return "accepted" if line_accepts(suggestion, task.line_rest) else "rejected"
    return "accepted" if block_accepts(suggestion, task.block) else "rejected"
