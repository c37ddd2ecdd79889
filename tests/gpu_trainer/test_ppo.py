"""PPO on the tiny starter model, for real (CPU): it learns what the rewards say, and only that."""

from __future__ import annotations

import hashlib
import json
import os
import random
from pathlib import Path

import pytest
import torch

from gpu_trainer.config import PPOConfig
from gpu_trainer.model_loading import seed_everything
from gpu_trainer.ppo import train_ppo
from tests.gpu_trainer.helpers import load, next_token_probs, prompt_ids, typed

# Strong enough that three updates show a clear effect on a model this small; the PPO clip
# (0.2) bounds how far each single update may move a token's probability.
# The counterfactual silent action is off here: these tests are about the sampled-action
# estimator and its baselines; the ones that switch it on say so.
FAST = PPOConfig(learning_rate=5e-3, epochs=4, num_minibatches=2, target_kl=None, silence_counterfactual=False)
ROUNDS = 3


def _train_rounds(base: Path, samples: list[dict], config: PPOConfig, out_root: Path) -> Path:
    """``ROUNDS`` successive updates, each continuing the previous adapter (as in production)."""
    parent = None
    for round_index in range(ROUNDS):
        out = out_root / f"round-{round_index}"
        train_ppo(config, typed(samples), base_model_dir=base, out_dir=out, parent_adapter_dir=parent, progress=False)
        parent = out
    return parent


@pytest.fixture(scope="module")
def setting(tiny_starter_model):
    """The FIM prompt, the base next-token distribution, a target token X and a few others."""
    prompt = prompt_ids(tiny_starter_model)
    probs = next_token_probs(load(tiny_starter_model), prompt)
    top = torch.topk(probs, 10).indices.tolist()
    candidates = [t for t in top if t != 0]  # never pick EOS as X
    return {"prompt": prompt, "base_probs": probs, "x": candidates[3], "others": candidates[:3] + candidates[4:9]}


def _completion(first: int, rng: random.Random) -> list[int]:
    return [first, rng.randrange(5, 2000)]


def test_ppo_raises_probability_of_the_rewarded_first_token(tiny_starter_model, setting, tmp_path):
    rng = random.Random(0)
    x, others = setting["x"], setting["others"]
    samples = []
    for i in range(16):
        first = x if i % 4 == 0 else others[i % len(others)]
        samples.append(
            {
                "prompt_token_ids": setting["prompt"],
                "completion_token_ids": _completion(first, rng),
                "behaviour_logprobs": None,
                "reward": 1.0 if first == x else -1.0,
            }
        )
    adapter = _train_rounds(tiny_starter_model, samples, FAST, tmp_path)
    before = setting["base_probs"][x].item()
    after = next_token_probs(load(tiny_starter_model, adapter), setting["prompt"])[x].item()
    assert after > 3 * before, (before, after)


def _silence_samples(setting) -> list[dict]:
    """Every shown (non-empty) completion is rejected (−1); staying silent scores 0."""
    rng = random.Random(1)
    samples = []
    for i in range(16):
        silent = i % 4 == 0
        samples.append(
            {
                "prompt_token_ids": setting["prompt"],
                "completion_token_ids": []
                if silent
                else _completion(setting["others"][i % len(setting["others"])], rng),
                "behaviour_logprobs": None,
                "reward": 0.0 if silent else -1.0,
            }
        )
    return samples


def test_silence_is_learnable_when_every_suggestion_is_rejected(tiny_starter_model, setting, tmp_path):
    """With the batch-mean baseline (−0.75 here) silence gets advantage +0.75: P(EOS first) rises."""
    adapter = _train_rounds(tiny_starter_model, _silence_samples(setting), FAST, tmp_path)
    eos = 0
    before = setting["base_probs"][eos].item()
    after = next_token_probs(load(tiny_starter_model, adapter), setting["prompt"])[eos].item()
    assert after > 3 * before, (before, after)


def _silence_in_other_contexts(setting) -> list[dict]:
    """The same data, but every silent sample sits on another prompt of the same length."""
    samples = _silence_samples(setting)
    other_prompt = list(reversed(setting["prompt"]))
    return [{**s, "prompt_token_ids": other_prompt} if not s["completion_token_ids"] else s for s in samples]


def _lora_weights(adapter_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(adapter_dir / "adapter_model.safetensors"))


def _max_weight_difference(a: Path, b: Path) -> float:
    wa, wb = _lora_weights(a), _lora_weights(b)
    return max(float((wa[k] - wb[k]).abs().max()) for k in wa)


def test_baseline_none_gives_silence_no_learning_signal(tiny_starter_model, setting, tmp_path):
    """The seed's weakness, reproduced by ``baseline="none"``: the rewards are all <= 0, silence
    scores exactly 0, so its advantage is 0 and the silent samples give no gradient at all.

    Shown exactly rather than by a threshold: under ``none``, moving every silent sample to
    another context leaves the trained adapter unchanged (nothing about silence is learned),
    while under the batch-mean baseline (silence +0.75) the adapter depends on where silence
    was rewarded. Both runs share the minibatch partition and the padded shapes, so the only
    difference is what the silent samples contribute. The KL penalty is off: it pulls every token
    toward the base model, silent ones included, and is not the reward signal under test."""
    config = FAST.replace(epochs=2, kl_coef=0.0)
    trained = {}
    for baseline in ("none", "batch_mean"):
        for name, data in (("here", _silence_samples(setting)), ("elsewhere", _silence_in_other_contexts(setting))):
            out = tmp_path / f"{baseline}-{name}"
            train_ppo(
                config.replace(baseline=baseline), typed(data), base_model_dir=tiny_starter_model, out_dir=out,
                    progress=False
            )
            trained[baseline, name] = out
    moved_none = _max_weight_difference(trained["none", "here"], trained["none", "elsewhere"])
    moved_batch_mean = _max_weight_difference(trained["batch_mean", "here"], trained["batch_mean", "elsewhere"])
    assert moved_none < 1e-6, moved_none
    assert moved_batch_mean > 1e-3, moved_batch_mean


def test_batch_mean_teaches_silence_where_baseline_none_does_not(tiny_starter_model, setting, tmp_path):
    """Behaviourally: on the same data, P(EOS first) ends far higher under the batch-mean baseline.
    Under ``none`` EOS still drifts up a little (the rejected tokens are pushed down and LoRA
    shares parameters), by 1.6-2.5x here across seeds and machines; under batch_mean by 8-10x."""
    eos = 0
    after = {}
    for baseline in ("none", "batch_mean"):
        adapter = _train_rounds(
            tiny_starter_model, _silence_samples(setting), FAST.replace(baseline=baseline), tmp_path / baseline
        )
        after[baseline] = next_token_probs(load(tiny_starter_model, adapter), setting["prompt"])[eos].item()
    assert after["batch_mean"] > 2 * after["none"], after


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_seed_gives_the_same_adapter_bytes(tiny_starter_model, setting, tmp_path):
    samples = _silence_samples(setting)
    config = PPOConfig(seed=7, learning_rate=1e-3, epochs=2, num_minibatches=2)
    first = train_ppo(config, typed(samples), base_model_dir=tiny_starter_model, out_dir=tmp_path / "a", progress=False)
    second = train_ppo(config, typed(samples), base_model_dir=tiny_starter_model, out_dir=tmp_path / "b",
                       progress=False)
    other_seed = train_ppo(
        config.replace(seed=8), typed(samples), base_model_dir=tiny_starter_model, out_dir=tmp_path / "c",
            progress=False
    )
    weights = "adapter_model.safetensors"
    assert _sha256(first.out_dir / weights) == _sha256(second.out_dir / weights)
    assert _sha256(first.out_dir / weights) != _sha256(other_seed.out_dir / weights)


def test_deterministic_seeding_sets_cublas_workspace_config_unless_the_environment_does(monkeypatch):
    """cuBLAS is deterministic on CUDA only under a workspace setting, read before its first use:
    the seeding block sets it (no GPU needed to see that), and leaves an operator's own."""
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # restored (here: removed) after the test
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    was = torch.are_deterministic_algorithms_enabled()
    try:
        seed_everything(0, deterministic=False)
        assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ
        seed_everything(0, deterministic=True)
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
        seed_everything(0, deterministic=True)
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    finally:
        torch.use_deterministic_algorithms(was, warn_only=True)


def test_the_summary_counts_prompts_cut_to_max_prompt_tokens(tiny_starter_model, setting, tmp_path):
    """A prompt over ``max_prompt_tokens`` is trained on its last tokens only (a FIM prompt without
    its leading sentinel): the run's summary says how many were."""
    longer = [
        {**s, "prompt_token_ids": [5] * 8 + s["prompt_token_ids"]} if i % 2 else s
        for i, s in enumerate(_silence_samples(setting))
    ]
    config = PPOConfig(epochs=1, num_minibatches=1, max_prompt_tokens=len(setting["prompt"]))
    result = train_ppo(config, typed(longer), base_model_dir=tiny_starter_model, out_dir=tmp_path / "out",
                       progress=False)
    assert result.summary["truncated_prompts"] == 8


def test_output_records_config_base_and_per_step_metrics(tiny_starter_model, setting, tmp_path):
    config = PPOConfig(epochs=2, num_minibatches=2, target_kl=None)
    result = train_ppo(
        config, typed(_silence_samples(setting)), base_model_dir=tiny_starter_model, out_dir=tmp_path / "out",
            progress=False
    )
    assert sorted(p.name for p in result.out_dir.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "metrics.jsonl",
        "strop_train_config.json",
    ]
    record = json.loads((result.out_dir / "strop_train_config.json").read_text())
    assert record["config"] == config.to_dict() and record["summary"]["truncated_prompts"] == 0
    assert record["base_model"] == str(Path(tiny_starter_model).resolve())
    assert record["parent_adapter"] is None and record["seed"] == config.seed
    rows = [json.loads(line) for line in (result.out_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == result.steps == 4
    for key in (
        "policy_loss",
        "approx_kl",
        "clip_fraction",
        "entropy",
        "grad_norm",
        "reward_mean",
        "reward_std",
        "advantage_mean",
        "advantage_std",
        "kl_to_base",
        "tokens_per_s",
    ):
        assert all(isinstance(row[key], float) for row in rows), key
    adapter_config = json.loads((result.out_dir / "adapter_config.json").read_text())
    assert adapter_config["r"] == config.lora_rank and adapter_config["bias"] == "none"
    assert not adapter_config.get("modules_to_save") and not adapter_config.get("use_dora")


def test_existing_output_directory_is_refused(tiny_starter_model, setting, tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(FileExistsError):
        train_ppo(
            PPOConfig(),
            typed(_silence_samples(setting)),
            base_model_dir=tiny_starter_model,
            out_dir=tmp_path / "out",
            progress=False,
        )


def test_target_kl_stops_the_update_early(tiny_starter_model, setting, tmp_path):
    config = FAST.replace(target_kl=1e-4, epochs=8)
    result = train_ppo(
        config, typed(_silence_samples(setting)), base_model_dir=tiny_starter_model, out_dir=tmp_path / "out",
            progress=False
    )
    assert result.stopped_early and result.steps < 16


def test_bf16_autocast_learns_the_rewarded_token_and_is_deterministic(tiny_starter_model, setting, tmp_path):
    """The faster CPU path (forward passes under bf16 autocast) still learns what the rewards say,
    and the same seed still gives the same adapter bytes."""
    x, others = setting["x"], setting["others"]
    rng = random.Random(0)
    samples = [
        {
            "prompt_token_ids": setting["prompt"],
            "completion_token_ids": _completion(x if i % 4 == 0 else others[i % len(others)], rng),
            "behaviour_logprobs": None,
            "reward": 1.0 if i % 4 == 0 else -1.0,
        }
        for i in range(16)
    ]
    config = FAST.replace(autocast_bf16=True)
    adapter = _train_rounds(tiny_starter_model, samples, config, tmp_path / "rounds")
    after = next_token_probs(load(tiny_starter_model, adapter), setting["prompt"])[x].item()
    assert after > 3 * setting["base_probs"][x].item()
    first = train_ppo(config, typed(samples), base_model_dir=tiny_starter_model, out_dir=tmp_path / "a", progress=False)
    second = train_ppo(config, typed(samples), base_model_dir=tiny_starter_model, out_dir=tmp_path / "b",
                       progress=False)
    weights = "adapter_model.safetensors"
    assert _sha256(first.out_dir / weights) == _sha256(second.out_dir / weights)
    assert first.summary["steps"] == second.summary["steps"] > 0


def _all_shown(setting, reward: float) -> list[dict]:
    """Sixteen shown completions with the same reward: silence is never sampled."""
    rng = random.Random(2)
    others = setting["others"]
    return [
        {
            "prompt_token_ids": setting["prompt"],
            "completion_token_ids": _completion(others[i % len(others)], rng),
            "behaviour_logprobs": None,
            "reward": reward,
        }
        for i in range(16)
    ]


def test_silence_counterfactual_teaches_silence_that_was_never_sampled(tiny_starter_model, setting, tmp_path):
    """Every suggestion rejected and silence never sampled: under the batch-mean baseline every
    advantage is 0, so plain PPO learns nothing at all; with the counterfactual silent action
    (reward 0 beats −1) P(EOS first) rises."""
    eos = 0
    before = setting["base_probs"][eos].item()
    plain = train_ppo(FAST, typed(_all_shown(setting, -1.0)), base_model_dir=tiny_starter_model,
                      out_dir=tmp_path / "plain",
                      progress=False)
    unchanged = next_token_probs(load(tiny_starter_model, plain.out_dir), setting["prompt"])[eos].item()
    assert abs(unchanged - before) < 1e-6, (before, unchanged)
    config = FAST.replace(silence_counterfactual=True, silence_clip=0.2)
    adapter = _train_rounds(tiny_starter_model, _all_shown(setting, -1.0), config, tmp_path / "silence")
    after = next_token_probs(load(tiny_starter_model, adapter), setting["prompt"])[eos].item()
    assert after > 10 * before, (before, after)


def test_silence_counterfactual_keeps_each_update_within_its_trust_region(tiny_starter_model, setting, tmp_path):
    """One update moves π(silent) by about ``silence_clip`` at most, in absolute probability."""
    eos = 0
    before = setting["base_probs"][eos].item()
    config = FAST.replace(silence_counterfactual=True, silence_clip=0.05, epochs=8)
    result = train_ppo(config, typed(_all_shown(setting, -1.0)), base_model_dir=tiny_starter_model,
                       out_dir=tmp_path / "one",
                       progress=False)
    after = next_token_probs(load(tiny_starter_model, result.out_dir), setting["prompt"])[eos].item()
    assert before + 0.02 < after < before + 0.05 + 0.02, (before, after)
    rows = [json.loads(line) for line in (result.out_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(isinstance(row["silence_prob"], float) and isinstance(row["silence_loss"], float) for row in rows)


def test_silence_counterfactual_lowers_silence_where_suggestions_are_accepted(tiny_starter_model, setting, tmp_path):
    eos = 0
    before = setting["base_probs"][eos].item()
    config = FAST.replace(silence_counterfactual=True)
    adapter = _train_rounds(tiny_starter_model, _all_shown(setting, 1.0), config, tmp_path / "accepted")
    after = next_token_probs(load(tiny_starter_model, adapter), setting["prompt"])[eos].item()
    assert after < before / 2, (before, after)


def test_silence_counterfactual_raises_the_token_a_stop_string_cuts_at_once(tiny_starter_model, setting, tmp_path):
    """Where a client's stop string makes a first token show nothing (a sample served as that one
    token and marked silent), staying silent that way is what the counterfactual raises."""
    cut = setting["others"][-1]  # plays the line break of a single-line editor
    samples = _all_shown(setting, -1.0)[:15] + [
        {"prompt_token_ids": setting["prompt"], "completion_token_ids": [cut], "behaviour_logprobs": None,
         "reward": 0.0, "silent": True}
    ]
    config = FAST.replace(silence_counterfactual=True, silence_clip=0.2)
    result = train_ppo(config, typed(samples), base_model_dir=tiny_starter_model, out_dir=tmp_path / "out",
                       progress=False)
    probs = next_token_probs(load(tiny_starter_model, result.out_dir), setting["prompt"])
    before = setting["base_probs"][cut].item() + setting["base_probs"][0].item()
    assert probs[cut].item() + probs[0].item() > 3 * before, (before, probs[cut].item(), probs[0].item())


def test_a_samples_own_silence_reward_overrides_the_configs(tiny_starter_model, setting, tmp_path):
    """An agent's turn: every answer disliked (−1), but answering nothing is worse (−2, the
    user asks again, louder). Where the config's silence reward (0) would raise silence, the
    samples' own lowers it."""
    eos = 0
    before = setting["base_probs"][eos].item()
    samples = [{**s, "silence_reward": -2.0} for s in _all_shown(setting, -1.0)]
    config = FAST.replace(silence_counterfactual=True, silence_clip=0.2)
    adapter = _train_rounds(tiny_starter_model, samples, config, tmp_path / "agent")
    after = next_token_probs(load(tiny_starter_model, adapter), setting["prompt"])[eos].item()
    assert after < before / 2, (before, after)


def test_with_a_show_gate_the_counterfactual_teaches_silence_only_to_agent_turns(tiny_starter_model, setting, tmp_path):
    """``silence_gated``: the show gate keeps completions silent, so every completion rejected
    and the counterfactual on leaves P(EOS first) where it was; the same events as an agent's
    turns (their own ``silence_reward``) still teach it."""
    eos = 0
    before = setting["base_probs"][eos].item()
    config = FAST.replace(silence_counterfactual=True, silence_clip=0.2, silence_gated=True)
    gated = train_ppo(config, typed(_all_shown(setting, -1.0)), base_model_dir=tiny_starter_model,
                      out_dir=tmp_path / "gated",
                      progress=False)
    unchanged = next_token_probs(load(tiny_starter_model, gated.out_dir), setting["prompt"])[eos].item()
    assert abs(unchanged - before) < 1e-6, (before, unchanged)
    turns = [{**sample, "silence_reward": 0.0} for sample in _all_shown(setting, -1.0)]
    adapter = _train_rounds(tiny_starter_model, turns, config, tmp_path / "turns")
    after = next_token_probs(load(tiny_starter_model, adapter), setting["prompt"])[eos].item()
    assert after > 10 * before, (before, after)
