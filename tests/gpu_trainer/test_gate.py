"""The eval gate on the tiny starter model, for real (CPU): it lets a sound update through and
stops a broken, jumpy or worse one, with the numbers that say why."""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from gpu_trainer.config import PPOConfig
from gpu_trainer.decoding import comparable, greedy_completions
from gpu_trainer.gate import GateConfig, GateVerdict, evaluate_candidate, off_policy_value
from gpu_trainer.model_loading import load_tokenizer, special_token_ids
from gpu_trainer.ppo import train_ppo
from learning_shared.errors import TrainerInputError
from learning_shared.fim import build_fim_prompt
from learning_shared.show_filter import ShowEvent
from tests.fixtures.vllm import write_random_lora
from tests.gpu_trainer.helpers import FIM_CASES, load, next_token_probs, prompt_ids, typed, without_fim_tokens

ACCEPTED, REJECTED = 0.75, -0.25
WEIGHTS = "adapter_model.safetensors"


@pytest.fixture(scope="module")
def setting(tiny_starter_model):
    """One FIM prompt, a target first token X the tenant's users accept, and tokens they reject."""
    prompt = prompt_ids(tiny_starter_model)
    top = torch.topk(next_token_probs(load(tiny_starter_model), prompt), 10).indices.tolist()
    candidates = [t for t in top if t != 0]  # never EOS
    return {"prompt": prompt, "x": candidates[3], "others": candidates[:3] + candidates[4:8]}


def _interactions(setting, *, count: int, seed: int) -> list[dict]:
    """Logged completions under one preference: those starting with X accepted, the rest rejected."""
    rng = random.Random(seed)
    samples = []
    for i in range(count):
        first = setting["x"] if i % 4 == 0 else setting["others"][i % len(setting["others"])]
        samples.append({
            "prompt_token_ids": setting["prompt"],
            "completion_token_ids": [first, rng.randrange(5, 2000)],
            "behaviour_logprobs": None,
            "reward": ACCEPTED if first == setting["x"] else REJECTED,
        })
    return samples


@pytest.fixture(scope="module")
def trained(tiny_starter_model, setting, tmp_path_factory) -> Path:
    """A candidate trained from the base model toward the accepted completions."""
    config = PPOConfig(learning_rate=5e-3, epochs=4, num_minibatches=2, target_kl=None)
    out = tmp_path_factory.mktemp("gate") / "trained"
    return train_ppo(config, typed(_interactions(setting, count=16, seed=0)), base_model_dir=tiny_starter_model,
                     out_dir=out, progress=False).out_dir


@pytest.fixture(scope="module")
def heldout(tiny_starter_model, setting) -> list[dict]:
    """Fresh interactions from the same preference; half carry the base model's serving log-probs."""
    samples = _interactions(setting, count=16, seed=1)
    model = load(tiny_starter_model)
    for sample in samples[::2]:
        ids = sample["prompt_token_ids"] + sample["completion_token_ids"]
        with torch.no_grad():
            logprobs = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), dim=-1)
        width = len(sample["completion_token_ids"])
        positions = range(len(ids) - width - 1, len(ids) - 1)
        sample["behaviour_logprobs"] = [float(logprobs[p, ids[p + 1]]) for p in positions]
    return samples


def _copy(adapter: Path, out: Path) -> Path:
    shutil.copytree(adapter, out)
    return out


def _json(verdict: GateVerdict) -> dict:
    return json.loads(json.dumps(verdict.as_dict(), allow_nan=False))


def test_candidate_identical_to_parent_passes_with_zero_kl_and_equal_rewards(tiny_starter_model, trained, heldout,
                                                                            tmp_path):
    verdict = evaluate_candidate(base_model_dir=tiny_starter_model, parent_adapter_dir=trained,
                                 candidate_adapter_dir=_copy(trained, tmp_path / "same"), heldout=typed(heldout))
    assert verdict.passed and verdict.reasons == [], verdict
    assert verdict.finite and verdict.kl_check == "passed" and verdict.reward_check == "passed"
    assert verdict.kl_to_parent == pytest.approx(0.0, abs=1e-6)
    assert verdict.kl_positions == 2 * len(heldout) and verdict.kl_source == "heldout"
    assert verdict.reward_candidate == pytest.approx(verdict.reward_parent, abs=1e-9)
    assert verdict.heldout_count == 16 and verdict.behaviour_known == 8 and verdict.truncated_prompts == 0
    assert _json(verdict)["kl_to_parent"] == verdict.kl_to_parent


def test_the_verdict_counts_held_out_prompts_cut_to_max_prompt_tokens(tiny_starter_model, trained, heldout, setting):
    """A held-out prompt over ``max_prompt_tokens`` is judged on its last tokens only (a FIM prompt
    without its leading sentinel, a context never served): the verdict says how many were."""
    longer = [{**s, "prompt_token_ids": [5] * 8 + s["prompt_token_ids"]} if i % 4 else s for i, s in enumerate(heldout)]
    verdict = evaluate_candidate(base_model_dir=tiny_starter_model, parent_adapter_dir=None,
                                 candidate_adapter_dir=trained, heldout=typed(longer),
                                 config=GateConfig(max_prompt_tokens=len(setting["prompt"])))
    assert verdict.truncated_prompts == 12 and _json(verdict)["truncated_prompts"] == 12


def test_candidate_trained_toward_accepted_completions_estimates_a_higher_reward(tiny_starter_model, trained,
                                                                                 heldout):
    verdict = evaluate_candidate(base_model_dir=tiny_starter_model, parent_adapter_dir=None,
                                 candidate_adapter_dir=trained, heldout=typed(heldout))
    mean_reward = sum(s["reward"] for s in heldout) / len(heldout)
    # The base model served these completions, so its estimate is the logged mean reward.
    assert verdict.reward_parent == pytest.approx(mean_reward, abs=1e-4)
    assert verdict.reward_candidate > verdict.reward_parent + 0.1, verdict
    assert 0 < verdict.kl_to_parent < GateConfig().max_kl
    assert verdict.passed and verdict.reward_check == "passed", verdict
    assert 1 <= verdict.effective_sample_size <= len(heldout)


def test_each_version_is_valued_as_its_show_gate_serves_it(tiny_starter_model, trained, heldout, tmp_path):
    """A suggestion a version's show gate withholds earns silence's reward in that version's value."""
    same = _copy(trained, tmp_path / "same")

    def judge(candidate: float | None, parent: float | None) -> GateVerdict:
        return evaluate_candidate(base_model_dir=tiny_starter_model, parent_adapter_dir=trained,
                                  candidate_adapter_dir=same, heldout=typed(heldout),
                                      candidate_show_threshold=candidate,
                                  parent_show_threshold=parent, silence_reward=0.1)

    plain = judge(None, None)
    assert plain.withheld_candidate == plain.withheld_parent == 0
    # Above every log-probability: the gate withholds every held-out suggestion.
    everything = judge(1.0, None)
    assert everything.withheld_candidate == len(heldout) and everything.withheld_parent == 0
    assert everything.reward_candidate == pytest.approx(0.1)
    assert everything.reward_parent == pytest.approx(plain.reward_parent, abs=1e-9)
    swapped = judge(None, 1.0)
    assert swapped.withheld_parent == len(heldout) and swapped.reward_parent == pytest.approx(0.1)
    assert swapped.reward_candidate == pytest.approx(plain.reward_candidate, abs=1e-9)
    nothing = judge(-1e9, -1e9)  # below every log-probability: nothing withheld, nothing changes
    assert nothing.withheld_candidate == nothing.withheld_parent == 0
    assert nothing.reward_candidate == pytest.approx(plain.reward_candidate, abs=1e-9)
    # Serving never gates a completion whose text was empty, nor an agent's turn.
    ungated = [{**heldout[0], "silent": True}, {**heldout[1], "silence_reward": -0.5},
               {**heldout[2], "completion_token_ids": [], "behaviour_logprobs": None}]
    verdict = evaluate_candidate(base_model_dir=tiny_starter_model, parent_adapter_dir=trained,
                                 candidate_adapter_dir=same, heldout=typed(ungated + heldout[3:]),
                                 candidate_show_threshold=1.0, silence_reward=0.1)
    assert verdict.withheld_candidate == len(heldout) - 3


def test_wildly_perturbed_adapter_fails_the_kl_bound(tiny_starter_model, heldout, tmp_path):
    wild = write_random_lora(tiny_starter_model, tmp_path / "wild", seed=3, b_std=3.0)
    verdict = evaluate_candidate(base_model_dir=tiny_starter_model, parent_adapter_dir=None,
                                 candidate_adapter_dir=wild, heldout=typed(heldout))
    assert not verdict.passed and verdict.finite and verdict.kl_check == "failed"
    assert verdict.kl_to_parent > 0.5
    assert f"KL to parent {verdict.kl_to_parent:.2f} exceeds bound 0.50" in verdict.reasons


def test_nan_adapter_fails_finite_without_raising(tiny_starter_model, trained, heldout, tmp_path):
    broken = _copy(trained, tmp_path / "nan")
    tensors = load_file(str(broken / WEIGHTS))
    name = next(k for k in tensors if "lora_B" in k)
    tensors[name][0, 0] = float("nan")
    save_file(tensors, str(broken / WEIGHTS))
    verdict = evaluate_candidate(base_model_dir=tiny_starter_model, parent_adapter_dir=None,
                                 candidate_adapter_dir=broken, heldout=typed(heldout), fim_eval=FIM_CASES)
    assert not verdict.passed and not verdict.finite
    assert "non-finite" in verdict.reasons[0]
    assert (verdict.kl_check, verdict.reward_check, verdict.fim_check) == ("skipped",) * 3
    assert _json(verdict)["passed"] is False


def test_too_few_heldout_samples_skip_the_reward_check_and_can_still_pass(tiny_starter_model, trained, heldout):
    verdict = evaluate_candidate(base_model_dir=tiny_starter_model, parent_adapter_dir=None,
                                 candidate_adapter_dir=trained, heldout=typed(heldout[:3]),
                                     config=GateConfig(min_heldout=8))
    assert verdict.reward_check == "skipped" and verdict.heldout_count == 3
    assert verdict.reward_candidate is not None  # measured, just not decisive
    assert verdict.passed and verdict.kl_check == "passed", verdict
    assert any("fewer than 8" in note for note in verdict.notes)


def test_without_heldout_samples_kl_is_measured_on_kl_prompts(tiny_starter_model, trained, setting):
    verdict = evaluate_candidate(base_model_dir=tiny_starter_model, parent_adapter_dir=None,
                                 candidate_adapter_dir=trained, heldout=[], kl_prompts=[setting["prompt"]])
    assert verdict.kl_source == "kl_prompts" and verdict.kl_positions == 1
    assert verdict.kl_to_parent > 0 and verdict.kl_check == "passed"
    assert verdict.reward_check == "skipped" and verdict.passed


def test_fim_set_is_scored_for_both_and_a_worse_candidate_fails(tiny_starter_model, tmp_path):
    """References are the base model's own greedy middles, so the base (the parent) scores a
    perfect 1.0 with the batched decoder too, and an adapter that scrambles the model cannot."""
    tokenizer = load_tokenizer(tiny_starter_model)
    model = load(tiny_starter_model)
    eos_id, pad_id = special_token_ids(tokenizer, model)
    prompts = [build_fim_prompt("qwen", case["prefix"], case["suffix"]) for case in FIM_CASES]
    middles = [greedy_completions(model, tokenizer, [prompt], family="qwen", eos_id=eos_id, pad_id=pad_id,
                                  max_new_tokens=8, max_tokens_per_pass=2048, device="cpu")[0] for prompt in prompts]
    cases = [{**case, "middle": middle} for case, middle in zip(FIM_CASES, middles, strict=True)]
    wild = write_random_lora(tiny_starter_model, tmp_path / "wild", seed=4, b_std=3.0)
    verdict = evaluate_candidate(base_model_dir=tiny_starter_model, parent_adapter_dir=None,
                                 candidate_adapter_dir=wild, heldout=[], fim_eval=cases,
                                 config=GateConfig(max_new_tokens=8, batch_size=3))
    assert verdict.fim_count == len(cases)
    assert verdict.fim_parent == {"exact_match": 1.0, "edit_similarity": 1.0}
    assert 0 <= verdict.fim_candidate["edit_similarity"] < 1 - GateConfig().fim_margin
    assert verdict.fim_check == "failed" and not verdict.passed
    assert any(reason.startswith("FIM edit similarity") for reason in verdict.reasons)
    assert verdict.kl_source == "fim" and verdict.kl_positions == len(cases)


def test_a_plain_model_is_fim_checked_on_its_prefix_only_completions(tiny_starter_model, tmp_path):
    """No FIM tokens: the prompt is the prefix alone, and a completion counts as many lines as the
    reference middle has (nothing tells a prefix-only model where the middle ends)."""
    plain = without_fim_tokens(tiny_starter_model, tmp_path / "plain")
    tokenizer = load_tokenizer(plain)
    model = load(plain)
    eos_id, pad_id = special_token_ids(tokenizer, model)
    prompts = [build_fim_prompt("plain", case["prefix"], case["suffix"]) for case in FIM_CASES]
    assert prompts == [case["prefix"] for case in FIM_CASES]
    firsts = [greedy_completions(model, tokenizer, [p], family="plain", eos_id=eos_id, pad_id=pad_id,
                                 max_new_tokens=8, max_tokens_per_pass=2048, device="cpu")[0].split("\n")[0]
              for p in prompts]
    cases = [{**case, "middle": first} for case, first in zip(FIM_CASES, firsts, strict=True)]
    wild = write_random_lora(plain, tmp_path / "wild", seed=4, b_std=3.0)
    verdict = evaluate_candidate(base_model_dir=plain, parent_adapter_dir=None, candidate_adapter_dir=wild,
                                 heldout=[], fim_eval=cases, config=GateConfig(max_new_tokens=8))
    assert verdict.fim_parent == {"exact_match": 1.0, "edit_similarity": 1.0}
    assert verdict.fim_check == "failed" and not verdict.passed


def test_comparable_cuts_a_plain_completion_to_the_reference_lines_only():
    assert comparable("a + b\n\n# usage", "a + b", "plain") == "a + b"
    assert comparable("x = 1\ny = 2\nz", "x = 1\ny = 2", "plain") == "x = 1\ny = 2"
    assert comparable("a + b\n\n# usage", "a + b", "qwen") == "a + b\n\n# usage"


def test_same_inputs_give_the_same_verdict(tiny_starter_model, trained, heldout):
    runs = [
        evaluate_candidate(base_model_dir=tiny_starter_model, parent_adapter_dir=None, candidate_adapter_dir=trained,
                           heldout=typed(heldout), config=GateConfig(seed=5)).as_dict()
        for _ in range(2)
    ]
    for run in runs:
        run.pop("seconds")
    assert runs[0] == runs[1]


def test_importance_weights_are_clipped_and_self_normalised():
    policy = torch.tensor([math.log(10.0), 0.0], dtype=torch.float64)
    behaviour = torch.zeros(2, dtype=torch.float64)
    value, ess = off_policy_value(policy, behaviour, torch.tensor([1.0, 0.0], dtype=torch.float64), cap=5.0)
    assert value == pytest.approx(5 / 6) and ess == pytest.approx(36 / 26)  # weights [5, 1], not [10, 1]
    value, ess = off_policy_value(policy - 1e4, behaviour, torch.tensor([1.0, 0.0], dtype=torch.float64), cap=5.0)
    assert math.isnan(value) and ess == 0.0  # the policy never produces the logged completions


def test_a_window_whose_accepts_run_against_the_model_fails_the_feedback_check(tiny_starter_model, trained, setting):
    """A client reporting outcomes the wrong way round: every other check reads the same reports
    and can pass the candidate; the window's accepts ranked below its rejections cannot."""
    clean = [ShowEvent(-1.0 - k / 10, True) for k in range(12)] + [ShowEvent(-5.0 - k / 10, False) for k in range(60)]
    inverted = [ShowEvent(e.score, not e.accepted) for e in clean]

    def gate(events, **config):
        return evaluate_candidate(base_model_dir=tiny_starter_model, parent_adapter_dir=None,
                                  candidate_adapter_dir=trained, heldout=[], kl_prompts=[setting["prompt"]],
                                  window_show_events=events, config=GateConfig(**config))

    passed = gate(clean)
    assert passed.passed and passed.feedback_check == "passed"
    assert passed.feedback_direction["auc"] == 1.0 and passed.feedback_direction["z"] > 4
    assert (passed.feedback_direction["accepted"], passed.feedback_direction["others"]) == (12, 60)
    failed = gate(inverted)
    assert not failed.passed and failed.feedback_check == "failed" and failed.kl_check == "passed"
    assert failed.feedback_direction["auc"] == 0.0
    assert failed.reasons[0].startswith("the window's feedback runs against the model: its 60 accepted suggestions "
                                        "scored lower than the 12 others (ROC AUC 0.00")
    assert _json(failed)["feedback_direction"]["accepted"] == 60
    unchecked = gate(inverted, feedback_direction_z=0)
    assert unchecked.passed and unchecked.feedback_check == "skipped" and unchecked.feedback_direction is None
    too_few = gate(inverted[:5] + inverted[12:])
    assert too_few.passed and too_few.feedback_check == "skipped"
    assert any(note.startswith("feedback direction not checked") for note in too_few.notes)
    with pytest.raises(TrainerInputError, match="feedback_direction_z"):
        GateConfig(feedback_direction_z=-1)
