"""Retained characters by edit distance: the bit-parallel measure agrees with the textbook table on
random strings, and reads as a developer would expect on kept, edited, moved and deleted code."""

from __future__ import annotations

import random

import pytest

from apps.interactions.retention import MAX_MEASURED, retained_chars, retained_from_ratio, retention_measure
from learning_shared.edit_match import approximate_match_distance, matched_stretch


def _table_distance(pattern: str, text: str) -> int:
    """Sellers' dynamic programme: the pattern against the best stretch of the text."""
    column = list(range(len(pattern) + 1))
    best = len(pattern)
    for char in text:
        previous, column = column, [0]
        for i in range(1, len(pattern) + 1):
            column.append(min(previous[i] + 1, column[i - 1] + 1, previous[i - 1] + (pattern[i - 1] != char)))
        best = min(best, column[-1])
    return best


def test_the_fast_measure_equals_the_dynamic_programme_on_random_strings():
    rng = random.Random(44)
    for _ in range(2000):
        pattern = "".join(rng.choice("ab c") for _ in range(rng.randint(1, 70)))
        text = "".join(rng.choice("ab cd") for _ in range(rng.randint(0, 90)))
        assert approximate_match_distance(pattern, text) == _table_distance(pattern, text), (pattern, text)


ACCEPTED = "    return sorted(items, key=lambda item: item.name)\n"


@pytest.mark.parametrize(
    ("reported", "kept"),
    [
        (ACCEPTED, len(ACCEPTED)),  # untouched
        ("def f(items):\n" + ACCEPTED + "\nprint(f([]))\n", len(ACCEPTED)),  # inside the whole document
        ("", 0),  # deleted
        ("def f(items):\n    pass\n", None),  # replaced by something else: little survives
        (ACCEPTED.replace("item.name", "item.title"), len(ACCEPTED) - 3),  # one word edited: "nam" gone
        (ACCEPTED.replace("sorted(", "sorted(list("), len(ACCEPTED)),  # typing inside it removes nothing
    ],
    ids=["kept", "in-document", "deleted", "replaced", "edited", "inserted"],
)
def test_retained_characters_read_as_a_developer_would_expect(reported, kept):
    measured = retained_chars(ACCEPTED, reported)
    if kept is None:
        assert measured < len(ACCEPTED) // 2
    else:
        assert measured == kept


@pytest.mark.parametrize("accepted", [")", "];", "ab"])
def test_a_completion_shorter_than_a_run_kept_as_is_keeps_every_character(accepted):
    assert retained_chars(accepted, f"foo(x{accepted}\n") == len(accepted)
    assert retained_chars(accepted, "") == 0


def test_a_completion_longer_than_the_cap_is_measured_by_its_start_and_scaled():
    accepted = "x = 1\n" * (MAX_MEASURED // 3)  # twice the cap
    assert retained_chars(accepted, accepted) == len(accepted)
    assert retained_chars(accepted, "") == 0


def test_a_clients_ratio_becomes_characters_within_the_accepted_text():
    assert retained_from_ratio(40, 0.5) == 20
    assert retained_from_ratio(40, 1.0) == 40
    assert retained_from_ratio(0, 1.0) == 0


def test_the_matched_stretch_is_what_is_left_of_the_accepted_text_in_the_document():
    document = "def f(items):\n    return sorted(items, key=len)[:3]\n\nprint(f([]))\n"
    kept, stretch = retention_measure("return sorted(items)", document)
    assert stretch in document and stretch.startswith("return sorted(items")
    assert kept == len("return sorted(items")  # the closing parenthesis is gone
    assert retention_measure("return sorted(items)", "print(1)\n")[0] == 0  # letters that line up by chance


def test_the_stretch_agrees_with_the_dynamic_programme_on_random_strings():
    rng = random.Random(7)
    for _ in range(500):
        pattern = "".join(rng.choice("abc") for _ in range(rng.randint(1, 30)))
        text = "".join(rng.choice("abcd") for _ in range(rng.randint(0, 60)))
        distance = _table_distance(pattern, text)
        stretch = matched_stretch(pattern, text)
        if distance < len(pattern):
            assert stretch in text and _levenshtein(pattern, stretch) == distance, (pattern, text, stretch)
        else:
            assert stretch == ""


def _levenshtein(a: str, b: str) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row = row, [i]
        for j, y in enumerate(b, 1):
            row.append(min(previous[j] + 1, row[j - 1] + 1, previous[j - 1] + (x != y)))
    return row[-1]
