"""The candidate's offline evaluation on the tenant's eval set, recorded by the gate (tiny starter
model, CPU): first-line and whole-middle matches and edit similarity for candidate, parent and
base, with 95 % intervals and the paired lift; and the figures' arithmetic on its own."""

from __future__ import annotations

import json
import math

import pytest

from gpu_trainer.gate import GateConfig, evaluate_candidate
from learning_shared.fim_metrics import CaseScore, first_line, first_line_match
from learning_shared.intervals import mean_interval, wilson
from learning_shared.offline_eval import FIGURES, fim_figures, offline_eval_of
from tests.fixtures.vllm import write_random_lora
from tests.gpu_trainer.helpers import FIM_CASES, with_base_middles

CONFIG = GateConfig(max_new_tokens=8, batch_size=3)
# Enough cases for the paired lift's interval (learning_shared.intervals.MIN_MEAN_INTERVAL_N).
CASES = [
    *FIM_CASES,
    {"prefix": "def mean(values):\n    ", "suffix": "\n    return total / len(values)\n", "middle": ""},
    {"prefix": "while queue:\n    ", "suffix": "\n    seen.add(item)\n", "middle": ""},
]


@pytest.fixture(scope="module")
def base_cases(tiny_starter_model) -> list[dict]:
    """FIM cases whose middles are the base model's own greedy ones: the base scores 1.0 on each."""
    return with_base_middles(tiny_starter_model, CASES)


@pytest.fixture(scope="module")
def adapters(tiny_starter_model, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("offline-eval")
    return {
        "parent": write_random_lora(tiny_starter_model, root / "parent", seed=7, b_std=0.02),
        "wild": write_random_lora(tiny_starter_model, root / "wild", seed=4, b_std=3.0),
    }


def test_the_gate_records_base_parent_and_candidate_figures_with_intervals_and_the_paired_lift(
    tiny_starter_model, base_cases, adapters
):
    verdict = evaluate_candidate(base_model_dir=tiny_starter_model, parent_adapter_dir=adapters["parent"],
                                 candidate_adapter_dir=adapters["wild"], heldout=[], fim_eval=base_cases,
                                 config=CONFIG)
    figures = verdict.fim_figures
    n = len(base_cases)
    assert figures["cases"] == n == verdict.fim_count
    # The references are the base model's middles: it gets every one right.
    base = figures["base"]
    assert {f: base[f]["value"] for f in FIGURES} == {f: 1.0 for f in FIGURES}
    assert base["first_line_match"]["high"] == 1.0 and base["first_line_match"]["low"] == pytest.approx(
        wilson(n, n).low)
    # The gate's own means are the figures' values.
    for model, means in (("candidate", verdict.fim_candidate), ("parent", verdict.fim_parent)):
        assert figures[model]["exact_match"]["value"] == pytest.approx(means["exact_match"])
        assert figures[model]["edit_similarity"]["value"] == pytest.approx(means["edit_similarity"])
    # A scrambled candidate is worse than a parent that barely moved from the base.
    assert figures["candidate"]["edit_similarity"]["value"] < figures["parent"]["edit_similarity"]["value"]
    for figure in FIGURES:
        lift = figures["lift"][figure]
        assert lift["n"] == n
        difference = figures["candidate"][figure]["value"] - figures["parent"][figure]["value"]
        assert lift["value"] == pytest.approx(difference)
        assert lift["low"] <= lift["value"] <= lift["high"]
        for model in ("base", "parent", "candidate"):
            estimate = figures[model][figure]
            assert estimate["n"] == n and estimate["low"] <= estimate["value"] <= estimate["high"]
    assert figures["lift"]["edit_similarity"]["value"] < 0
    # Stored as JSON and read back as the API and the page read it.
    stored = json.loads(json.dumps(verdict.as_dict()))
    assert offline_eval_of(stored)["candidate"] == figures["candidate"]


def test_a_parent_that_is_the_base_model_has_no_separate_base_row(tiny_starter_model, base_cases, adapters):
    verdict = evaluate_candidate(base_model_dir=tiny_starter_model, parent_adapter_dir=None,
                                 candidate_adapter_dir=adapters["wild"], heldout=[], fim_eval=base_cases,
                                 config=CONFIG)
    assert verdict.fim_figures["base"] is None
    assert verdict.fim_figures["parent"]["first_line_match"]["value"] == 1.0


def test_without_fim_cases_there_are_no_figures(tiny_starter_model, adapters):
    verdict = evaluate_candidate(base_model_dir=tiny_starter_model, parent_adapter_dir=None,
                                 candidate_adapter_dir=adapters["wild"], heldout=[], config=CONFIG)
    assert verdict.fim_figures is None and offline_eval_of(verdict.as_dict()) is None


def test_the_first_line_is_the_first_non_blank_one_whitespace_aside():
    assert first_line("\n   return  a +\tb  \n    # done") == "return a + b"
    assert first_line_match("return a + b\nx = 1", "  return a  + b\n\ny = 2")
    assert not first_line_match("return a - b", "return a + b")
    assert first_line_match("", "   \n") and not first_line_match("x", "")
    # A middle that opens a new line is not matched by the same text on the cursor's line.
    assert first_line_match("\n    return x", "\n  return x\n")
    assert not first_line_match("return x", "\n    return x")
    assert not first_line_match("\nreturn x", "return x")


def test_wilson_and_the_normal_interval_match_reference_values():
    assert (wilson(0, 10).low, round(wilson(0, 10).high, 4)) == (0.0, 0.2775)
    five = wilson(5, 10)
    assert (round(five.low, 4), round(five.high, 4)) == (0.2366, 0.7634)
    assert wilson(0, 0).value is None
    with pytest.raises(ValueError):
        wilson(3, 2)
    interval = mean_interval([0.0, 1.0, 1.0, 0.0, 1.0, 0.0])  # Student's t, 5 degrees of freedom
    assert interval.value == 0.5 and interval.high - 0.5 == pytest.approx(2.571 * math.sqrt(0.3) / math.sqrt(6))
    assert mean_interval([0.0, 1.0] * 40).high - 0.5 == pytest.approx(1.959963984540054 * math.sqrt(80 / 79 / 4 / 80))
    assert mean_interval([0.4]).low is None
    # A handful of equal differences is no certainty: no interval below five cases.
    assert (mean_interval([1.0, 1.0]).low, mean_interval([1.0, 1.0, 1.0, 1.0]).high) == (None, None)
    every = [wilson(k, n) for n in range(1, 80) for k in range(n + 1)]
    assert all(0.0 <= e.low <= e.value <= e.high <= 1.0 for e in every)  # no rounding error outside the value


def test_the_lift_is_paired_by_case():
    """The same cases won and lost in another order: unpaired means agree, the paired lift sees
    every case change."""
    yes, no = CaseScore(True, True, 1.0), CaseScore(False, False, 0.0)
    figures = fim_figures({"candidate": [yes, no] * 3, "parent": [no, yes] * 3})
    lift = figures["lift"]["first_line_match"]
    assert lift["value"] == 0.0 and lift["high"] - lift["low"] > 1.5
    assert (lift["low"], lift["high"]) == (-1.0, 1.0)  # a difference of shares stays within [-1, 1]
    same = fim_figures({"candidate": [yes, no] * 3, "parent": [yes, no] * 3})["lift"]["exact_match"]
    assert (same["value"], same["low"], same["high"]) == (0.0, 0.0, 0.0)
    # Two cases both fixed: no interval, so the page claims no direction.
    few = fim_figures({"candidate": [yes, yes], "parent": [no, no]})["lift"]["first_line_match"]
    assert (few["value"], few["low"], few["high"]) == (1.0, None, None)


def test_a_verdict_stored_before_the_figures_reads_back_as_means_without_intervals():
    old = {"passed": True, "fim_check": "passed", "fim_count": 12,
           "fim_candidate": {"exact_match": 0.5, "edit_similarity": 0.8},
           "fim_parent": {"exact_match": 0.25, "edit_similarity": 0.7}}
    record = offline_eval_of(old)
    assert record["cases"] == 12 and record["base"] is None and record["eval_set"] is None
    assert record["candidate"]["exact_match"] == {"value": 0.5, "low": None, "high": None, "n": 12}
    assert record["candidate"]["first_line_match"] is None
    assert record["lift"]["edit_similarity"]["value"] == pytest.approx(0.1)
    assert offline_eval_of({"fim_check": "skipped", "fim_count": 0}) is None and offline_eval_of({}) is None
