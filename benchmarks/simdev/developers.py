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

When a suggestion is not accepted whole, a developer of either population still uses what is
right in it, as editors let them (``respond``):

* **Word by word** (VS Code's accept-next-word, which Copilot and Cursor also offer; the editor
  reports the accepted length): they take the suggestion one word at a time while each word is
  what they were going to type, and stop at the first that is not. A *word* is a run of letters,
  digits and underscores or a single other character, with the blanks before it; it matches when
  it equals the next word of what they meant to type, blanks aside.
* **Fixing a nearly right one**: when the whole suggestion is close to what they meant (edit
  similarity at least ``NEARLY_RIGHT``) and fixing it costs fewer keystrokes (its edit distance)
  than typing what follows the words they could take, they accept it and fix it (``edited``); the
  editor sees the text that ends up where the suggestion went, which is what they meant to type.
  A suggestion that is right all along but stops short of what the population accepts is taken
  whole and then finished by hand: ``edited`` too, its every character kept.

They report only what an editor observes: the outcome, how many characters were taken, the text
left in the suggestion's place. Never text they did not write.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Literal

from .persistence import retained_at_last_checkpoint
from .tasks import Population, Task

Outcome = Literal["accepted", "rejected", "not_shown", "partial", "edited"]
POPULATIONS: tuple[Population, ...] = ("line", "block")
BLOCK_MIN_SIMILARITY = 0.9
NEARLY_RIGHT = 0.8  # edit similarity from which a developer takes a suggestion and fixes it
# The tenants' default reward policy (Cursor's Tab RL): what the summaries report.
REWARDS: dict[str, float] = {"accepted": 0.75, "rejected": -0.25, "not_shown": 0.0, "partial": 0.25, "edited": 0.25}
_WORD = re.compile(r"\s*(?:\w+|[^\w\s])")


@dataclass(frozen=True)
class Decision:
    """What a developer did with a suggestion, as an editor reports it: the outcome, and for
    ``partial`` the characters taken, for ``edited`` the text left where the suggestion went."""

    outcome: Outcome
    accepted_chars: int | None = None
    kept_text: str | None = None
    # What of it was still there 10 minutes later (simdev.persistence): characters put in the file, kept.
    # Derived from the above and the task, so not part of a decision's identity.
    accepted_text_chars: int = field(default=0, compare=False)
    retained_chars: int = field(default=0, compare=False)

    def feedback(self) -> dict[str, object]:
        """The fields of the feedback event beyond the interaction (the API's shape)."""
        item: dict[str, object] = {"outcome": self.outcome}
        if self.accepted_chars is not None:
            item["accepted_chars"] = self.accepted_chars
        if self.kept_text is not None:
            item["kept_text"] = self.kept_text
        return item


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


def edit_distance(a: str, b: str) -> int:
    """The Levenshtein distance of ``a`` and ``b``."""
    return round((1.0 - edit_similarity(a, b)) * max(len(a), len(b)))


def words_taken(suggestion: str, meant: str) -> int:
    """How many leading characters of ``suggestion`` a developer takes word by word: up to the end
    of the last word that equals, blanks aside, the next word of ``meant`` (0: not even the first)."""
    truth = [w.strip() for w in _WORD.findall(meant)]
    end = 0
    for k, match in enumerate(_WORD.finditer(suggestion)):
        if match.start() != end or k >= len(truth) or match.group().strip() != truth[k]:
            break
        end = match.end()
    return end


def respond(population: Population, suggestion: str, task: Task) -> Decision:
    """What a developer of ``population`` does with ``suggestion`` at ``task`` (module docstring),
    and what of it is still there at the last checkpoint (``simdev.persistence``)."""
    decision = _respond(population, suggestion, task)
    accepted, retained = retained_at_last_checkpoint(
        decision.outcome, suggestion, decision.accepted_chars, task.middle(population)
    )
    return replace(decision, accepted_text_chars=accepted, retained_chars=retained)


def _respond(population: Population, suggestion: str, task: Task) -> Decision:
    if population not in POPULATIONS:
        raise ValueError(f"population must be one of {POPULATIONS}, not {population!r}")
    if not is_shown(suggestion):
        return Decision("not_shown")
    meant = task.middle(population)
    accepts = line_accepts(suggestion, meant) if population == "line" else block_accepts(suggestion, meant)
    if accepts:
        return Decision("accepted")
    text, meant = suggestion.rstrip(), meant.rstrip()
    taken = words_taken(text, meant)
    right_but_short = taken == len(text)
    nearly_right = edit_similarity(text, meant) >= NEARLY_RIGHT and edit_distance(text, meant) < len(meant) - taken
    if right_but_short or nearly_right:
        return Decision("edited", kept_text=meant)
    if taken > 0 and text[:taken].strip():
        return Decision("partial", accepted_chars=taken)
    return Decision("rejected")


def decide(population: Population, suggestion: str, task: Task) -> Outcome:
    """The outcome of what a developer of ``population`` does with ``suggestion`` at ``task``."""
    return respond(population, suggestion, task).outcome
