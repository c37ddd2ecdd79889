"""An edit's pairwise loss (``preference_coef``): the text the user kept, which the model never
served, gains on the completion they were shown; on the tiny starter model, for real (CPU)."""

from __future__ import annotations

import hashlib
import json
import math

import pytest
import torch
from transformers import AutoTokenizer

from gpu_trainer.config import PPOConfig
from gpu_trainer.ppo import train_ppo
from gpu_trainer.preference import preference_loss, preference_rows
from learning_shared.errors import TrainerInputError
from learning_shared.samples import Sample, check_samples_against_vocab
from tests.gpu_trainer.helpers import completion_logprobs, load, prompt_ids, typed

# As tests/gpu_trainer/test_ppo.py: strong enough for one update to show, silence off (not under test).
FAST = PPOConfig(learning_rate=5e-3, epochs=4, num_minibatches=2, target_kl=None, silence_counterfactual=False)
SHOWN, KEPT = "return a + b", "return a * b"
EDITED = 0.25  # the policy's reward for an edit (default), the same for every sample


@pytest.fixture(scope="module")
def pair(tiny_starter_model):
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_starter_model))
    prompt = prompt_ids(tiny_starter_model)
    shown = tokenizer.encode(SHOWN, add_special_tokens=False)
    kept = tokenizer.encode(KEPT, add_special_tokens=False)
    assert shown[:2] == kept[:2] and shown[2] != kept[2]  # "return a" shared, then " +" against " *"
    base = load(tiny_starter_model)
    return {"prompt": prompt, "shown": shown, "kept": kept, "margin": _margin(base, prompt, shown, kept)}


def _margin(model, prompt: list[int], shown: list[int], kept: list[int]) -> float:
    """log π(kept) − log π(shown), each the sum over its tokens."""
    return sum(completion_logprobs(model, prompt, kept)) - sum(completion_logprobs(model, prompt, shown))


def _samples(pair, n: int = 8, **fields) -> list[dict]:
    return [
        {"prompt_token_ids": pair["prompt"], "completion_token_ids": pair["shown"], "behaviour_logprobs": None,
         "reward": EDITED, "preferred_token_ids": pair["kept"], **fields}
        for _ in range(n)
    ]


def _sha256(path) -> str:
    return hashlib.sha256((path / "adapter_model.safetensors").read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ([], "preferred_token_ids is empty"),
        ("12", "preferred_token_ids must be a list of integers"),
        ([1, 2.5], "preferred_token_ids must be a list of integers"),
        ([1, True], "preferred_token_ids must be a list of integers"),
    ],
)
def test_preferred_token_ids_must_be_a_nonempty_list_of_token_ids(value, words):
    data = {"prompt_token_ids": [1, 2], "completion_token_ids": [3, 4], "reward": 0.25, "preferred_token_ids": value}
    with pytest.raises(TrainerInputError, match=words):
        Sample.from_dict(data, 0)


def test_preferred_token_ids_are_kept_written_back_and_checked_against_the_vocabulary():
    data = {"prompt_token_ids": [1, 2], "completion_token_ids": [3, 4], "reward": 0.25, "preferred_token_ids": [3, 9]}
    sample = Sample.from_dict(data, 0)
    assert sample.preferred_token_ids == (3, 9)
    assert Sample.from_dict(sample.to_dict(), 0) == sample
    assert Sample.from_dict({**data, "preferred_token_ids": None}, 0).preferred_token_ids is None
    with pytest.raises(TrainerInputError, match=r"sample 0: preferred_token_ids\[1\] = 9 is outside"):
        check_samples_against_vocab([sample], 5)
    # A kept text that is the completion itself is no pair.
    same = Sample.from_dict({**data, "preferred_token_ids": [3, 4]}, 1)
    assert preference_rows([sample, same, Sample.from_dict({**data, "preferred_token_ids": None}, 2)]) == [0]


def test_the_pairwise_loss_starts_at_log_2_and_pushes_the_kept_text_up_and_the_shown_one_down():
    """At the update's start (new = old) every pair's margin is 0: the loss is coef · log 2 per pair
    over the minibatch's samples, and its gradient is ∓ coef · β / 2 over the same count."""
    old_kept, old_shown = torch.tensor([-3.0, -5.0]), torch.tensor([-2.0, -1.0])
    new_kept, new_shown = old_kept.clone().requires_grad_(), old_shown.clone().requires_grad_()
    loss, margins = preference_loss(new_kept, new_shown, old_kept, old_shown, beta=0.1, coef=2.0, denominator=4)
    assert math.isclose(loss.item(), 2.0 * 2 * math.log(2) / 4, rel_tol=1e-6)
    assert margins.tolist() == [0.0, 0.0]
    loss.backward()
    assert torch.allclose(new_kept.grad, torch.full((2,), -2.0 * 0.1 / 2 / 4))
    assert torch.allclose(new_shown.grad, torch.full((2,), 2.0 * 0.1 / 2 / 4))
    # Once the kept text has gained far more than 2 / β nats, the push has faded.
    far, _ = preference_loss(torch.tensor([97.0]), torch.tensor([-2.0]), torch.tensor([-3.0]), torch.tensor([-2.0]),
                             beta=0.1, coef=2.0, denominator=4)
    assert far.item() < 1e-4


def test_an_edit_trains_toward_the_kept_text_it_never_served(pair, tiny_starter_model, tmp_path):
    """Every event is the same edit with one scalar reward, so PPO's advantages are all 0: alone,
    nothing moves. With the pairwise loss the kept text " *" gains on the shown " +", though the
    model never served " *". Margins: across seeds 0-2 the kept text gained 6.1-6.6 nats on the
    shown one, and " *" itself rose by 1.18-1.24."""
    config = FAST.replace(preference_coef=1.0)
    result = train_ppo(config, typed(_samples(pair)), base_model_dir=tiny_starter_model, out_dir=tmp_path / "pref",
                       progress=False)
    model = load(tiny_starter_model, result.out_dir)
    gain = _margin(model, pair["prompt"], pair["shown"], pair["kept"]) - pair["margin"]
    assert gain > 2.0, (pair["margin"], gain)
    kept_after = completion_logprobs(model, pair["prompt"], pair["kept"])
    kept_before = completion_logprobs(load(tiny_starter_model), pair["prompt"], pair["kept"])
    assert kept_after[2] > kept_before[2] + 0.5, (kept_before, kept_after)  # " *" itself rises

    rows = _metrics(result.out_dir)
    assert all(row["preference_pairs"] == 4 and row["preference_loss"] is not None for row in rows)
    assert rows[0]["preference_margin"] == pytest.approx(0.0, abs=1e-4)  # the first step starts from the old policy
    assert rows[-1]["preference_margin"] > 1.0

    off = train_ppo(FAST, typed(_samples(pair)), base_model_dir=tiny_starter_model, out_dir=tmp_path / "off",
                    progress=False)
    still = _margin(load(tiny_starter_model, off.out_dir), pair["prompt"], pair["shown"], pair["kept"])
    assert abs(still - pair["margin"]) < 1e-3, (pair["margin"], still)


def test_with_the_pairwise_loss_off_a_kept_text_changes_nothing(pair, tiny_starter_model, tmp_path):
    """``preference_coef`` 0 (the default): the same adapter bytes with or without kept texts, on
    samples whose rewards differ (PPO moves the policy)."""
    rewards = [0.75, -0.25, 0.25, 0.0] * 2
    plain = [{**s, "reward": r} for s, r in zip(_samples(pair), rewards, strict=True)]
    for s in plain:
        del s["preferred_token_ids"]
    with_kept = [{**s, "preferred_token_ids": pair["kept"]} for s in plain]
    a = train_ppo(FAST, typed(plain), base_model_dir=tiny_starter_model, out_dir=tmp_path / "plain", progress=False)
    b = train_ppo(FAST, typed(with_kept), base_model_dir=tiny_starter_model, out_dir=tmp_path / "kept", progress=False)
    assert _sha256(a.out_dir) == _sha256(b.out_dir)
    assert all(row["preference_loss"] is None for row in _metrics(b.out_dir))


def _metrics(out_dir) -> list[dict]:
    return [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
