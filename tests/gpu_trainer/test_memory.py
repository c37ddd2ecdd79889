"""Memory bounded by the token budget: passes never exceed it, and how a minibatch is cut into
passes does not change what the trainer learns."""

from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_file

from gpu_trainer.batching import plan_micro_batches
from gpu_trainer.config import PPOConfig
from gpu_trainer.logprobs import chosen_token_logprobs, entropy_from_logits
from gpu_trainer.losses import masked_mean
from gpu_trainer.ppo import train_ppo
from tests.gpu_trainer.helpers import typed

WEIGHTS = "adapter_model.safetensors"


def test_passes_respect_the_budget_group_similar_lengths_and_give_a_long_sequence_its_own():
    lengths = [50, 10, 30, 12, 200, 11, 29]
    passes = plan_micro_batches(lengths, range(len(lengths)), max_tokens=60)
    assert sorted(i for p in passes for i in p) == list(range(len(lengths)))
    assert passes == [[1, 5, 3], [6, 2], [0], [4]]  # shortest first; 200 > 60 runs alone
    for part in passes[:-1]:
        assert len(part) * max(lengths[i] for i in part) <= 60
    assert plan_micro_batches(lengths, [0, 1, 3], max_tokens=10_000, max_rows=2) == [[1, 3], [0]]


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean"])
def test_shares_of_the_passes_add_up_to_the_minibatch_mean(aggregation):
    values = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 1], [0, 1, 1, 1], [0, 0, 1, 1]], dtype=torch.float32)
    whole = masked_mean(values, mask, aggregation)
    shares = dict(tokens=int(mask.sum()), sequences=5)
    parts = [slice(0, 2), slice(2, 3), slice(3, 5)]
    split = sum(masked_mean(values[s], mask[s], aggregation, **shares) for s in parts)
    assert torch.allclose(whole, split, atol=1e-6)


def test_chosen_token_logprobs_and_entropy_match_the_full_log_softmax():
    logits = torch.randn(3, 5, 50, generator=torch.Generator().manual_seed(1)) * 4
    targets = torch.randint(0, 50, (3, 5), generator=torch.Generator().manual_seed(2))
    full = torch.log_softmax(logits, dim=-1)
    chosen, lse = chosen_token_logprobs(logits, targets)
    assert torch.allclose(chosen, full.gather(-1, targets.unsqueeze(-1)).squeeze(-1), atol=1e-5)
    assert torch.allclose(entropy_from_logits(logits, lse), -(full.exp() * full).sum(-1), atol=1e-5)


def _with_kept_texts(samples: list[dict], seed: int) -> list[dict]:
    """Every third shown sample an edit, with a kept text of 1 to 8 tokens (the pairwise loss)."""
    rng = random.Random(seed)
    return [
        {**s, "preferred_token_ids": [rng.randrange(5, 2000) for _ in range(rng.randint(1, 8))]}
        if i % 3 == 0 and s["completion_token_ids"] else s
        for i, s in enumerate(samples)
    ]


def _varied_samples(count: int, seed: int) -> list[dict]:
    """Prompts of 4 to 40 tokens and completions of 0 to 6 (silence included), mixed rewards."""
    rng = random.Random(seed)
    samples = []
    for _ in range(count):
        completion = [rng.randrange(5, 2000) for _ in range(rng.choice([0, 1, 3, 6]))]
        samples.append(
            {
                "prompt_token_ids": [rng.randrange(5, 2000) for _ in range(rng.randint(4, 40))],
                "completion_token_ids": completion,
                "behaviour_logprobs": [-rng.uniform(0.1, 4.0) for _ in completion] or None,
                "reward": rng.choice([0.75, -0.25, 0.0]),
            }
        )
    return samples


@pytest.mark.parametrize(
    ("aggregation", "preference_coef"), [("token_mean", 0.0), ("sequence_mean", 0.0), ("token_mean", 1.0)]
)
def test_one_pass_and_many_passes_train_the_same_adapter(tiny_starter_model, tmp_path, aggregation, preference_coef):
    samples = _with_kept_texts(_varied_samples(16, seed=3), seed=3)
    # A parent-like start is not needed: epoch 2 already steps from a moved policy.
    config = PPOConfig(
        dtype="float32",
        device="cpu",
        learning_rate=1e-3,
        epochs=2,
        num_minibatches=2,
        target_kl=None,
        loss_aggregation=aggregation,
        preference_coef=preference_coef,
    )
    weights = {}
    for name, budget in (("one", 100_000), ("many", 64)):
        result = train_ppo(
            config.replace(max_tokens_per_pass=budget),
            typed(samples),
            base_model_dir=tiny_starter_model,
            out_dir=tmp_path / name,
            progress=False,
        )
        rows = [line for line in (result.out_dir / "metrics.jsonl").read_text().splitlines()]
        assert ('"passes": 1,' in rows[0]) == (name == "one")
        weights[name] = load_file(str(result.out_dir / WEIGHTS))
    moved = max(float(t.abs().max()) for k, t in weights["one"].items() if "lora_B" in k)
    assert moved > 2 * config.learning_rate  # four Adam steps of ~lr each moved lora_B from zero
    # Float summation order differs between the layouts, and Adam divides each gradient by its
    # own magnitude, so a near-zero gradient's rounding can show: allow 1% of one step (lr).
    for key, one in weights["one"].items():
        assert torch.allclose(one, weights["many"][key], rtol=0, atol=0.01 * config.learning_rate), key


@pytest.fixture
def forward_sizes(monkeypatch) -> list[int]:
    """Tokens (rows × length) of every forward pass of any model, as they happen."""
    from transformers import PreTrainedModel

    seen: list[int] = []
    original = PreTrainedModel.__call__

    def record(self, *args, **kwargs):
        ids = kwargs.get("input_ids")
        if ids is not None and ids.dim() == 2:
            seen.append(ids.numel())
        return original(self, *args, **kwargs)

    monkeypatch.setattr(PreTrainedModel, "__call__", record)
    return seen


def test_every_forward_pass_stays_within_the_budget(tiny_starter_model, tmp_path, forward_sizes):
    """Old, reference, update and pairwise passes alike: no forward pass sees more tokens than the
    budget."""
    seen = forward_sizes
    samples = _with_kept_texts(_varied_samples(20, seed=4), seed=4)
    budget = 96
    first = train_ppo(
        PPOConfig(max_tokens_per_pass=budget, target_kl=None, learning_rate=1e-3),
        typed(samples),
        base_model_dir=tiny_starter_model,
        out_dir=tmp_path / "first",
        progress=False,
    )
    seen.clear()
    # A non-zero KL coefficient with a parent adapter needs the reference pass too.
    train_ppo(
        PPOConfig(max_tokens_per_pass=budget, target_kl=None, kl_coef=0.1, preference_coef=1.0),
        typed(samples),
        base_model_dir=tiny_starter_model,
        out_dir=tmp_path / "second",
        parent_adapter_dir=first.out_dir,
        progress=False,
    )
    assert seen and max(seen) <= budget
    # 20 samples; every one in an old, a reference and 2 epochs of update passes.
    assert len(seen) > 4 * len(samples) * 40 // budget


def test_gate_passes_stay_within_the_budget(tiny_starter_model, tmp_path, forward_sizes):
    from gpu_trainer.gate import GateConfig, evaluate_candidate
    from tests.fixtures.vllm import write_random_lora

    candidate = write_random_lora(tiny_starter_model, tmp_path / "candidate", seed=5, b_std=0.01)
    cases = [{"prefix": "def f(x):\n    " * k, "suffix": "\n", "middle": "return x"} for k in range(1, 6)]
    budget = 80
    verdict = evaluate_candidate(
        base_model_dir=tiny_starter_model,
        parent_adapter_dir=None,
        candidate_adapter_dir=candidate,
        heldout=typed(_varied_samples(12, seed=6)),
        fim_eval=cases,
        config=GateConfig(max_tokens_per_pass=budget, max_new_tokens=8),
    )
    assert verdict.kl_positions > 0 and verdict.fim_count == len(cases)
    assert forward_sizes and max(forward_sizes) <= budget


def test_a_minibatch_past_target_kl_stops_before_the_backward_that_proves_it(tiny_starter_model, tmp_path,
                                                                             monkeypatch):
    """Each token's KL term is ≥ 0, so the passes read so far bound the minibatch's KL from below:
    the pass that crosses ``target_kl`` is not backpropagated, nor are the passes after it, and
    the update stops where reading the whole minibatch first would have stopped it."""
    counts = {"backward": 0, "update_forwards": 0}
    original_backward = torch.Tensor.backward

    def backward(self, *args, **kwargs):
        counts["backward"] += 1
        return original_backward(self, *args, **kwargs)

    from transformers import PreTrainedModel

    original_call = PreTrainedModel.__call__

    def call(self, *args, **kwargs):
        if torch.is_grad_enabled() and type(self).__name__.endswith("ForCausalLM"):  # not its inner model
            counts["update_forwards"] += 1
        return original_call(self, *args, **kwargs)

    samples = _varied_samples(16, seed=3)
    config = PPOConfig(dtype="float32", device="cpu", learning_rate=1e-3, epochs=6, num_minibatches=2,
                       target_kl=0.02)
    results, weights = {}, {}
    for name, budget in (("one", 100_000), ("many", 64)):
        counts.update(backward=0, update_forwards=0)
        monkeypatch.setattr(torch.Tensor, "backward", backward)
        monkeypatch.setattr(PreTrainedModel, "__call__", call)
        result = train_ppo(config.replace(max_tokens_per_pass=budget), typed(samples),
                           base_model_dir=tiny_starter_model,
                           out_dir=tmp_path / name, progress=False)
        monkeypatch.undo()
        rows = [json.loads(line) for line in (result.out_dir / "metrics.jsonl").read_text().splitlines()]
        stepped_passes = sum(row["passes"] for row in rows)
        assert result.stopped_early and result.steps < config.epochs * config.num_minibatches, name
        # Every stepped minibatch's passes were backpropagated; the stopped one's crossing pass was not.
        assert counts["backward"] < counts["update_forwards"], (name, counts)
        assert counts["update_forwards"] - counts["backward"] == 1, (name, counts)
        assert counts["backward"] >= stepped_passes, (name, counts, stepped_passes)
        results[name] = result
        weights[name] = load_file(str(result.out_dir / WEIGHTS))
    assert results["one"].steps == results["many"].steps
    for key, one in weights["one"].items():
        assert torch.allclose(one, weights["many"][key], rtol=0, atol=0.01 * config.learning_rate), key
