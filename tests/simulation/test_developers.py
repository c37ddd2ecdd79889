"""The simulated developers' rules (pure): noise is never accepted, the right answers are."""

from __future__ import annotations

import math
import random
import string

import pytest

from benchmarks.simdev import (
    REWARDS,
    Decision,
    block_accepts,
    decide,
    edit_similarity,
    line_accepts,
    load_tasks,
    mean_interval,
    normalise_line,
    respond,
    wilson,
    words_taken,
)
from benchmarks.simdev.tasks import Task

BLOCK = "self._lock = threading.Lock()\n        self._items = []\n        self._closed = False"


def task(line_rest: str, block: str | None = None) -> Task:
    return Task(
        id="t", split="eval", package="p", path="p/m.py", line=1, column=1, prefix="x",
        line_rest=line_rest, block=block if block is not None else line_rest, suffix="", block_suffix="",
    )  # fmt: skip


@pytest.fixture(scope="module")
def real_tasks() -> list[Task]:
    return load_tasks("eval", 150, seed=5)


def noise(rng: random.Random) -> str:
    alphabet = string.ascii_letters + string.digits + string.punctuation + "  \n"
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 80)))


# ---- line developers ----


def test_line_developer_accepts_the_rest_of_the_line_up_to_whitespace():
    rest = " self._lock.acquire(timeout=5)"
    for text in (rest, rest.strip(), rest + "\n", rest + "  \n\n", " self._lock.acquire(timeout=5) "):
        assert line_accepts(text, rest), repr(text)
    assert line_accepts("self._lock.acquire(timeout=5)", "self._lock.acquire(timeout=5)")
    assert line_accepts("a  =  b", "a = b")  # a run of blanks inside reads as one space


def test_line_developer_rejects_anything_but_that_exact_line():
    rest = " self._lock.acquire(timeout=5)"
    for text in (
        "self._lock.acquire(timeout=6)",  # one character off: exact match only
        "self._lock.acquire(",  # a right start is not the line
        "self._lock.acquire(timeout=5) and garbage",
        "self._lock.acquire(timeout=5)\n        return True",  # right line, then another: multi-line noise
        "\nself._lock.acquire(timeout=5)",
        "selfx_lock.acquire(timeout=5)",
        "self._lock.acquire(timeout = 5)",  # blanks are not inserted where there were none
    ):
        assert not line_accepts(text, rest), repr(text)


def test_line_developer_rejects_a_correct_block_of_several_lines():
    assert not line_accepts(BLOCK, "self._lock = threading.Lock()")
    # It takes the first line, word by word (an editor's accept-next-word), and not the rest.
    first = "self._lock = threading.Lock()"
    assert respond("line", BLOCK, task(first, BLOCK)) == Decision("partial", accepted_chars=len(first))


# ---- what a developer takes of a suggestion that is not accepted whole ----


def test_word_by_word_the_developer_takes_the_words_that_match_and_stops_at_the_first_that_does_not():
    rest = "self._lock.acquire(timeout=5)"
    assert respond("line", "self._lock.release()", task(rest)) == Decision("partial", accepted_chars=len("self._lock."))
    # blanks aside: " x  =" takes the words of "x =" (its own characters are counted)
    assert words_taken(" x  = y", "x = 1") == len(" x  =")
    assert words_taken("selfish", "self.x") == 0  # half a word is never taken
    assert respond("line", "other()", task(rest)) == Decision("rejected")


def test_a_nearly_right_suggestion_is_accepted_and_fixed_when_fixing_is_cheaper_than_typing():
    rest = "total = compute_total(items, tax_rate=0.2)"
    fixed = respond("line", "total = compute_total(items, tax_rate=0.3)", task(rest))
    assert fixed == Decision("edited", kept_text=rest)  # one character to fix, 4 to type
    # a wrong start: nothing to take word by word, and far from the line
    assert respond("line", "print(value)", task(rest)).outcome == "rejected"
    # right all along but short of the line: taken whole, then finished by hand
    assert respond("line", "total = compute_total(items", task(rest)) == Decision("edited", kept_text=rest)


def test_what_is_reported_is_what_an_editor_observes():
    rest = "return self._items[index]"
    partial = respond("line", "return self._items.pop()", task(rest))
    assert partial.feedback() == {"outcome": "partial", "accepted_chars": len("return self._items")}
    assert respond("line", rest, task(rest)).feedback() == {"outcome": "accepted"}
    # The kept text of an edit is the developer's own line, never text they did not write.
    edited = respond("line", "return self._items[idx]", task(rest)).feedback()
    assert edited == {"outcome": "edited", "kept_text": rest}


def test_partial_takes_fit_the_api_on_real_tasks(real_tasks):
    """accepted_chars is 1 to the suggestion's length − 1, on every kind of cut of real lines."""
    seen = set()
    for t in real_tasks:
        for cut in range(1, len(t.line_rest)):
            text = t.line_rest[:cut] + "zz_wrong()"
            decision = respond("line", text, t)
            seen.add(decision.outcome)
            if decision.outcome == "partial":
                assert 1 <= decision.accepted_chars < len(text)
                taken = text[: decision.accepted_chars].split()
                assert taken == t.line_rest.split()[: len(taken)] or " ".join(taken) in t.line_rest, (t.id, text)
    assert {"partial", "edited", "rejected"} <= seen


# ---- block developers ----


def test_block_developer_accepts_the_block_and_a_start_of_it_of_two_lines_or_more():
    assert block_accepts(BLOCK, BLOCK)
    assert block_accepts(BLOCK + "\n", BLOCK)
    assert block_accepts("\n".join(BLOCK.split("\n")[:2]), BLOCK)
    assert block_accepts(BLOCK.replace("[]", "[ ]"), BLOCK)  # similarity 0.99 >= 0.9


def test_block_developer_takes_a_single_line_only_where_the_line_ends_the_block():
    assert not block_accepts("self._lock = threading.Lock()", BLOCK)
    assert block_accepts("self._lock = threading.Lock()", "self._lock = threading.Lock()")


def test_block_developer_rejects_noise_around_a_right_first_line():
    first = "self._lock = threading.Lock()"
    for text in (
        first + "\n        garbage garbage garbage",
        first + "\n        self._items = []\n        self._closed = False\n        return self",  # past the block
        first + "\n" + BLOCK.split("\n", 1)[1].replace("        ", ""),  # the right lines, unindented
        "self._lock = threading.RLock()\n" + BLOCK.split("\n", 1)[1],  # the first line wrong, the rest right
        first + " x\n" + BLOCK.split("\n", 1)[1],
    ):
        assert not block_accepts(text, BLOCK), repr(text)


# ---- both ----


@pytest.mark.parametrize("population", ["line", "block"])
def test_nothing_to_show_is_not_shown_never_a_rejection(population):
    for text in ("", " ", "\n", "\n    \n", "\t"):
        assert decide(population, text, task("x = 1", "x = 1\ny = 2")) == "not_shown"
    assert not line_accepts("", "") and not block_accepts("", "x")
    assert REWARDS == {"accepted": 0.75, "rejected": -0.25, "not_shown": 0.0, "partial": 0.25, "edited": 0.25}


@pytest.mark.parametrize("population", ["line", "block"])
def test_random_text_and_the_right_line_plus_garbage_are_never_accepted(population, real_tasks):
    rng = random.Random(7)
    for t in real_tasks:
        for _ in range(5):
            assert decide(population, noise(rng), t) != "accepted"
        garbage = "".join(rng.choice(string.ascii_letters + "()[]=.") for _ in range(rng.randint(12, 40)))
        for text in (t.line_rest + " " + garbage, t.line_rest + "\n    " + garbage + "\n    " + garbage):
            decision = respond(population, text, t)
            # At most the right words are taken; the garbage never is, nor fixed into the line.
            assert decision.outcome in ("partial", "rejected"), (text, decision)
            assert decision.accepted_chars is None or decision.accepted_chars <= len(t.line_rest) + 1


def test_the_right_answers_are_accepted_on_real_tasks(real_tasks):
    for t in real_tasks:
        single = "\n" not in t.block
        assert decide("line", t.line_rest, t) == "accepted"
        assert decide("block", t.block, t) == "accepted"
        # Right but short of the block: taken whole and finished by hand.
        assert respond("block", t.line_rest, t) == (
            Decision("accepted") if single else Decision("edited", kept_text=t.block.rstrip())
        )
        # More than the line: its first line taken, word by word.
        assert decide("line", t.block, t) == ("accepted" if single else "partial")
    assert any("\n" in t.block for t in real_tasks) and any("\n" not in t.block for t in real_tasks)


def test_normalise_and_edit_similarity():
    assert normalise_line("  a \t b  ") == "a b"
    assert normalise_line("    a   b ", keep_indent=True) == "    a b"
    assert normalise_line("\ta", keep_indent=True) == "    a"
    assert edit_similarity("", "") == 1.0 and edit_similarity("abc", "") == 0.0
    assert edit_similarity("kitten", "sitting") == pytest.approx(1 - 3 / 7)
    with pytest.raises(ValueError):
        decide("tab", "x", task("x"))  # type: ignore[arg-type]


# ---- the intervals of the summaries ----


def test_wilson_interval_matches_reference_values():
    assert (wilson(0, 10).low, round(wilson(0, 10).high, 4)) == (0.0, 0.2775)
    five = wilson(5, 10)
    assert (five.value, round(five.low, 4), round(five.high, 4), five.n) == (0.5, 0.2366, 0.7634, 10)
    assert math.isnan(wilson(0, 0).value)
    with pytest.raises(ValueError):
        wilson(3, 2)


def test_mean_interval_is_the_normal_one():
    estimate = mean_interval([0.75, -0.25, 0.0, 0.75])
    assert estimate.value == pytest.approx(0.3125)
    half = 1.959963984540054 * 0.5153882032022076 / 2  # sample sd (n - 1) / sqrt(4)
    assert (estimate.low, estimate.high) == (pytest.approx(0.3125 - half), pytest.approx(0.3125 + half))
    assert math.isnan(mean_interval([0.75]).low) and math.isnan(mean_interval([]).value)


def test_what_a_developer_keeps_ten_minutes_later_is_what_they_meant_measured_by_edit_distance():
    rest = "total = compute_total(items, tax_rate=0.2)"
    kept = respond("line", rest, task(rest))
    assert (kept.accepted_text_chars, kept.retained_chars) == (len(rest), len(rest))  # right: all stays
    fixed = respond("line", "total = compute_total(items, tax_rate=0.3)", task(rest))
    # One character edited: it goes, and the ")" after it, a run too short to count.
    assert (fixed.accepted_text_chars, fixed.retained_chars) == (len(rest), len(rest) - 2)
    partial = respond("line", "total = compute(x)", task(rest))
    assert partial.outcome == "partial" and partial.retained_chars == partial.accepted_text_chars == len("total =")
    rejected = respond("line", "print(value)", task(rest))
    assert (rejected.accepted_text_chars, rejected.retained_chars) == (0, 0)
