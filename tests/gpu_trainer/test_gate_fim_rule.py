"""The eval gate's FIM check decides on the paired difference candidate − parent over the tenant's
eval set (its 95 % interval), not on a fixed margin between two means; under 5 cases it falls back
to the margin and says so (tiny starter model, CPU, greedy: no sampling, no luck)."""

from __future__ import annotations

import json
import shutil

import pytest

from gpu_trainer.gate import FAILED, PASSED, GateConfig, evaluate_candidate, fim_decision
from learning_shared.offline_eval import offline_eval_of
from tests.fixtures.vllm import write_random_lora
from tests.gpu_trainer.helpers import FIM_CASES, with_base_middles

CONFIG = GateConfig(max_new_tokens=8, batch_size=4)
CASES = [
    *FIM_CASES,
    {"prefix": "def mean(values):\n    ", "suffix": "\n    return total / len(values)\n", "middle": ""},
    {"prefix": "while queue:\n    ", "suffix": "\n    seen.add(item)\n", "middle": ""},
    {"prefix": "def greet(name):\n    ", "suffix": "\n\ngreet('world')\n", "middle": ""},
    {"prefix": "numbers = [1, 2, 3]\nfor n in numbers:\n    ", "suffix": "\n", "middle": ""},
]


@pytest.fixture(scope="module")
def base_cases(tiny_starter_model) -> list[dict]:
    """Cases whose middles are the base model's own greedy ones: the base gets every one right."""
    return with_base_middles(tiny_starter_model, CASES)


@pytest.fixture(scope="module")
def adapters(tiny_starter_model, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("fim-rule")
    parent = write_random_lora(tiny_starter_model, root / "parent", seed=7, b_std=0.02)
    return {
        "parent": parent,
        "same": shutil.copytree(parent, root / "same"),  # the parent's weights, as a new candidate
        "garbage": write_random_lora(tiny_starter_model, root / "garbage", seed=4, b_std=3.0),
    }


def _gate(tiny_starter_model, *, parent, candidate, cases, config=CONFIG):
    return evaluate_candidate(base_model_dir=tiny_starter_model, parent_adapter_dir=parent,
                              candidate_adapter_dir=candidate, heldout=[], fim_eval=cases, config=config)


def test_a_candidate_wrong_on_every_case_is_rejected_by_the_paired_interval(tiny_starter_model, base_cases,
                                                                            adapters):
    verdict = _gate(tiny_starter_model, parent=None, candidate=adapters["garbage"], cases=base_cases)
    figures = verdict.fim_figures
    assert figures["parent"]["exact_match"]["value"] == 1.0  # the base, whose middles the cases hold
    assert figures["candidate"]["first_line_match"]["value"] == 0.0, figures["candidate"]  # not one right
    interval = verdict.fim_interval
    assert verdict.fim_rule == "paired" and interval["n"] == len(base_cases)
    assert interval["high"] < -CONFIG.fim_margin and interval["bound"] == -CONFIG.fim_margin
    assert {k: interval[k] for k in ("value", "low", "high", "n")} == figures["lift"]["edit_similarity"]
    assert verdict.fim_check == "failed" and not verdict.passed
    reason = next(r for r in verdict.reasons if r.startswith("FIM edit similarity"))
    assert f"over {len(base_cases)} cases lies wholly below" in reason
    assert not any("fixed margin" in note for note in verdict.notes)
    stored = json.loads(json.dumps(verdict.as_dict(), allow_nan=False))  # as the run keeps it
    assert stored["fim_interval"] == interval and offline_eval_of(stored)["rule"] == "paired"


def test_a_candidate_with_its_parents_weights_passes_with_a_zero_difference(tiny_starter_model, base_cases,
                                                                           adapters):
    verdict = _gate(tiny_starter_model, parent=adapters["parent"], candidate=adapters["same"], cases=base_cases)
    assert verdict.fim_candidate == verdict.fim_parent
    assert verdict.fim_rule == "paired" and verdict.fim_check == "passed"
    assert (verdict.fim_interval["value"], verdict.fim_interval["low"], verdict.fim_interval["high"]) == (0.0,) * 3
    assert verdict.passed and verdict.reasons == [], verdict


def test_under_five_cases_the_check_falls_back_to_the_margin_and_says_so(tiny_starter_model, base_cases, adapters):
    few = base_cases[:4]
    verdict = _gate(tiny_starter_model, parent=None, candidate=adapters["garbage"], cases=few)
    assert verdict.fim_rule == "margin" and verdict.fim_count == 4
    assert verdict.fim_interval["low"] is None and verdict.fim_interval["high"] is None
    assert verdict.fim_interval["bound"] == -CONFIG.fim_margin
    assert verdict.fim_check == "failed" and not verdict.passed
    assert any("by more than the margin 0.020" in reason for reason in verdict.reasons)
    assert any(note.startswith("FIM check by the fixed margin 0.020, not the paired interval: 4 case(s)")
               for note in verdict.notes)
    # The margin decides there: wide enough, the same candidate passes, still by the margin.
    wide = GateConfig(max_new_tokens=8, batch_size=4, fim_margin=1.0)
    lenient = _gate(tiny_starter_model, parent=None, candidate=adapters["garbage"], cases=few, config=wide)
    assert lenient.fim_rule == "margin" and lenient.fim_check == "passed"
    assert any("fixed margin 1.000" in note for note in lenient.notes)


def _difference(value, low, high, n=32):
    return {"value": value, "low": low, "high": high, "n": n}


def test_the_paired_rule_fails_only_an_interval_wholly_below_minus_the_margin():
    config = GateConfig(fim_margin=0.0)
    decide = fim_decision
    # A drop the size of the old margin's, within the noise of its cases: passed, not failed.
    assert decide(_difference(-0.038, -0.09, 0.014), candidate=0.377, parent=0.415, config=config) == (
        "paired", PASSED, None)
    rule, check, reason = decide(_difference(-0.03, -0.05, -0.01), candidate=0.40, parent=0.43, config=config)
    assert (rule, check) == ("paired", FAILED)
    assert reason == ("FIM edit similarity 0.400 is below the parent's 0.430 on the eval set: the paired difference "
                      "-0.030 [-0.050, -0.010] over 32 cases lies wholly below 0")
    # The margin (0.02 by default) lets through a loss the set shows is smaller than it.
    tolerant = GateConfig()
    assert decide(_difference(-0.03, -0.05, -0.01), candidate=0.40, parent=0.43, config=tolerant)[1] == PASSED
    assert decide(_difference(-0.08, -0.12, -0.03), candidate=0.40, parent=0.48, config=tolerant)[1] == FAILED
    # A gain never fails, however small the margin.
    assert decide(_difference(0.05, 0.01, 0.09), candidate=0.5, parent=0.45, config=config)[1] == PASSED
    # No interval: the mean difference against the margin.
    assert decide(_difference(-0.01, None, None, n=3), candidate=0.5, parent=0.51, config=tolerant) == (
        "margin", PASSED, None)
    assert decide(_difference(-0.01, None, None, n=3), candidate=0.5, parent=0.51, config=config)[:2] == (
        "margin", FAILED)
    assert decide(_difference(-0.2, None, None, n=3), candidate=0.3, parent=0.5, config=tolerant)[:2] == (
        "margin", FAILED)


def test_a_negative_tolerance_is_refused():
    from learning_shared.errors import TrainerInputError

    with pytest.raises(TrainerInputError, match="fim_margin must be >= 0"):
        GateConfig(fim_margin=-0.1)
