"""Client FIM conventions recognised, and stop strings applied beyond vLLM's four (pure, no server)."""

from __future__ import annotations

import pytest

from apps.engines.stops import StopScanner, earliest_stop, tokens_through
from apps.serving.prompts import parse_fim_prompt


@pytest.mark.parametrize(
    ("prompt", "convention", "prefix", "suffix"),
    [
        ("<fim_prefix>def f(<fim_suffix>)\n<fim_middle>", "starcoder", "def f(", ")\n"),
        ("<|fim_prefix|>a = <|fim_suffix|>\nb<|fim_middle|>", "qwen", "a = ", "\nb"),
        ("<|repo_name|>r\n<|file_sep|>x.py\n<|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>", "qwen", "a", "b"),
        ("<PRE> def f( <SUF>)\n <MID>", "codellama", "def f(", ")\n"),
        ("<｜fim▁begin｜>x<｜fim▁hole｜>y<｜fim▁end｜>", "deepseek", "x", "y"),
        ("<[fim-prefix]>x<[fim-suffix]>y<[fim-middle]>", "seed-coder", "x", "y"),
        ("[SUFFIX]tail\n[PREFIX]head", "codestral", "head", "tail\n"),
    ],
)
def test_the_common_fim_conventions_are_recognised(prompt, convention, prefix, suffix):
    parsed = parse_fim_prompt(prompt)
    assert parsed is not None
    assert (parsed.convention, parsed.prefix, parsed.suffix) == (convention, prefix, suffix)


@pytest.mark.parametrize(
    "prompt",
    [
        "def f(x):\n    return x\n",
        "# the <fim_prefix> token is documented here\n",  # one marker alone
        "<fim_prefix>a<fim_suffix>b<fim_middle>c",  # does not end on the middle marker: not a request
        "<fim_suffix>b<fim_prefix>a<fim_middle>",  # markers out of order
        "<fim_prefix>a<fim_prefix>b<fim_suffix>c<fim_middle>",  # a marker twice
    ],
)
def test_plain_prompts_and_code_that_mentions_markers_are_left_alone(prompt):
    assert parse_fim_prompt(prompt) is None


def test_the_earliest_stop_wins_and_the_longer_one_on_a_tie():
    assert earliest_stop("ab\n\ncd", ["cd", "\n", "\n\n"]) == (2, "\n\n")
    assert earliest_stop("abc", ["x"]) is None


def test_a_cut_keeps_the_token_the_stop_starts_in():
    offsets = [0, 3, 5, 9]  # tokens "abc", "de", "fghi", "j"
    assert tokens_through(offsets, 4) == 2  # "e" is in the second token
    assert tokens_through(offsets, 5) == 3
    assert tokens_through(offsets, 0) == 1


def test_the_scanner_never_releases_part_of_a_stop_string():
    scanner = StopScanner(["</end>", "\n\n"])
    released = [scanner.feed(piece) for piece in ["x = 1", "</e", "n", "d>", "more"]]
    assert released == ["x = 1", "", "", "", ""]
    assert scanner.stopped == "</end>" and scanner.sent == 5


def test_the_scanner_releases_a_held_back_tail_that_turned_out_not_to_stop():
    scanner = StopScanner(["</end>"])
    assert scanner.feed("a</e") == "a"
    assert scanner.feed("x") == "</ex"
    assert scanner.feed("</") == ""
    assert scanner.finish() == "</"
    assert scanner.stopped is None and scanner.sent == len("a</ex</")


def test_a_fim_prompt_with_a_suffix_beside_it_is_refused_when_the_request_is_read():
    # Before routing: a refused request spends no rate-limit unit and records no exposure.
    from apps.serving.schemas import CompletionIn

    both = CompletionIn(data={"prompt": "<fim_prefix>a<fim_suffix>b<fim_middle>", "suffix": "c"})
    assert not both.is_valid() and "suffix" in both.errors
    insert = CompletionIn(data={"prompt": "def add(a, b):\n    ", "suffix": "\n"})  # OpenAI's insert form
    assert insert.is_valid(), insert.errors
