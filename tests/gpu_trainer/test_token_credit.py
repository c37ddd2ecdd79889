"""Token-level credit (``token_rewards``): a partial accept or an edit rewards the tokens the user
kept and penalises the first one they did not, on the tiny starter model, for real (CPU)."""

from __future__ import annotations

import hashlib
import json
import math
import random

import pytest
import torch
from transformers import AutoTokenizer

from gpu_trainer.config import PPOConfig
from gpu_trainer.losses import clipped_policy_loss, compute_advantages, token_advantages
from gpu_trainer.ppo import train_ppo
from learning_shared.errors import TrainerInputError
from learning_shared.samples import Sample
from tests.gpu_trainer.helpers import completion_logprobs, load, prompt_ids, typed

# As tests/gpu_trainer/test_ppo.py: strong enough for one update to show, silence off (not under test).
FAST = PPOConfig(learning_rate=5e-3, epochs=4, num_minibatches=2, target_kl=None, silence_counterfactual=False)
ACCEPTED, REJECTED, PARTIAL = 0.75, -0.25, 0.25  # the policy's defaults


@pytest.fixture(scope="module")
def served(tiny_starter_model):
    """The FIM prompt and a served completion, "return a + b", as the tiny model's tokens."""
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_starter_model))
    completion = tokenizer.encode("return a + b", add_special_tokens=False)
    assert len(completion) == 4  # "return", " a", " +", " b"
    prompt = prompt_ids(tiny_starter_model)
    return {
        "prompt": prompt,
        "completion": completion,
        "base": completion_logprobs(load(tiny_starter_model), prompt, completion),
    }


def _sample(served, **fields) -> dict:
    return {
        "prompt_token_ids": served["prompt"],
        "completion_token_ids": served["completion"],
        "behaviour_logprobs": None,
        **fields,
    }


@pytest.mark.parametrize(
    ("token_rewards", "words"),
    [
        ([0.75, 0.75, -0.25], "has 3 entries but completion_token_ids has 4"),
        ([0.75, 0.75, -0.25, math.nan], "token_rewards[3] = nan is not a finite number"),
        ([0.75, math.inf, -0.25, 0.0], "token_rewards[1] = inf"),
        ([0.75, True, -0.25, 0.0], "must be a list of numbers"),
        ("0.75", "must be a list of numbers"),
    ],
)
def test_token_rewards_must_be_one_finite_number_per_completion_token(token_rewards, words):
    data = {
        "prompt_token_ids": [1, 2],
        "completion_token_ids": [3, 4, 5, 6],
        "reward": 0.25,
        "token_rewards": token_rewards,
    }
    with pytest.raises(TrainerInputError, match="sample 7: ") as caught:
        Sample.from_dict(data, 7)
    assert words in str(caught.value)


def test_token_rewards_are_kept_and_written_back():
    data = {"prompt_token_ids": [1, 2], "completion_token_ids": [3, 4], "reward": 0.25, "token_rewards": [0.75, -1]}
    sample = Sample.from_dict(data, 0)
    assert sample.token_rewards == (0.75, -1.0)
    assert Sample.from_dict(sample.to_dict(), 0) == sample
    assert Sample.from_dict({**data, "token_rewards": None}, 0).token_rewards is None


@pytest.mark.parametrize("baseline", ["batch_mean", "none"])
@pytest.mark.parametrize("normalize", [False, True])
def test_a_token_carrying_its_samples_reward_gets_exactly_its_samples_advantage(baseline, normalize):
    """The baseline and the normalisation of token advantages are those of the per-sequence ones."""
    rewards = torch.tensor([0.75, -0.25, 0.25, 0.0, 0.25])
    token_rewards = [None, [-0.25, -0.25], [0.25, 0.25, 0.25], None, [0.75, -0.25, 0.0]]
    per_sequence = compute_advantages(rewards, baseline=baseline, normalize=normalize, token_rewards=token_rewards)
    per_token = token_advantages(token_rewards, rewards, baseline=baseline, normalize=normalize)
    assert per_token[0] is None and per_token[3] is None
    assert torch.equal(per_token[1], per_sequence[1].repeat(2))
    assert torch.equal(per_token[2], per_sequence[2].repeat(3))
    # A token's advantage is its own reward against the same baseline, on the same scale.
    scale = per_sequence[2] / (0.25 - (float(rewards.mean()) if baseline == "batch_mean" else 0.0))
    expected = (torch.tensor([0.75, -0.25, 0.0]) - (rewards.mean() if baseline == "batch_mean" else 0.0)) * scale
    assert torch.allclose(per_token[4], expected, atol=1e-5)


@pytest.mark.parametrize("baseline", ["batch_mean", "none"])
def test_token_rewards_equal_to_the_samples_reward_leave_the_normalised_advantages_as_without_them(baseline):
    rewards = torch.tensor([0.75, -0.25, 0.25, 0.0, 0.25])
    plain = compute_advantages(rewards, baseline=baseline, normalize=True)
    carried = [[0.75], None, [0.25, 0.25, 0.25], [0.0, 0.0], None]
    assert torch.equal(compute_advantages(rewards, baseline=baseline, normalize=True, token_rewards=carried), plain)


def test_normalised_partial_accepts_alone_get_token_advantages_on_their_tokens_spread():
    """Three partial accepts (scalar 0.25 each: no spread) whose tokens were kept, refused, untaken.
    Divided by the scalar rewards' spread (~1e-8) their token advantages were ±5e7 and the policy
    loss ~1e7; divided by the spread of the token advantages themselves they are about ±1."""
    rewards = torch.tensor([PARTIAL] * 3)
    token_rewards = [[ACCEPTED, ACCEPTED, REJECTED, 0.0]] * 3
    per_token = token_advantages(token_rewards, rewards, baseline="batch_mean", normalize=True)
    # Each sample counts the mean of its tokens' squared advantages, 0.203125; three over n − 1 = 2.
    expected = torch.tensor([0.5, 0.5, -0.5, -0.25]) / math.sqrt(3 * 0.203125 / 2)
    for advantages in per_token:
        assert torch.allclose(advantages, expected, atol=1e-5), advantages
    scalar = compute_advantages(rewards, baseline="batch_mean", normalize=True, token_rewards=token_rewards)
    assert scalar.tolist() == [0.0, 0.0, 0.0]


def test_normalised_token_advantages_stay_bounded_and_keep_their_sign():
    """Any window of the policy's rewards, partial accepts among them, normalised: each advantage
    the update uses has the sign of its reward − the batch mean, and is at most sqrt((n − 1) ·
    tokens) in size (the spread counts every sample's tokens, each sample weighing one)."""
    rng = random.Random(0)
    outcomes = [ACCEPTED, REJECTED, 0.0, PARTIAL]
    for _ in range(300):
        n = rng.randint(2, 12)
        rewards = torch.tensor([rng.choice(outcomes) for _ in range(n)])
        if rng.random() < 0.3:
            rewards = torch.full((n,), PARTIAL)  # no spread among the scalar rewards
        token_rewards = [
            [rng.choice([ACCEPTED, REJECTED, 0.0]) for _ in range(rng.randint(1, 8))] if rng.random() < 0.5 else None
            for _ in range(n)
        ]
        scalar = compute_advantages(rewards, baseline="batch_mean", normalize=True, token_rewards=token_rewards)
        per_token = token_advantages(token_rewards, rewards, baseline="batch_mean", normalize=True)
        centred = rewards - rewards.mean()
        for index, (values, advantages) in enumerate(zip(token_rewards, per_token, strict=True)):
            if values is None:  # the sample's one advantage is the one its tokens get
                assert advantages is None
                advantages, own = scalar[index : index + 1], centred[index : index + 1]
                bound = math.sqrt(n - 1)
            else:
                own = torch.tensor(values) - rewards.mean()
                bound = math.sqrt((n - 1) * len(values))
            assert advantages.abs().max() <= bound + 1e-4, (rewards, token_rewards)
            moved = own.abs() > 1e-6
            assert torch.equal(advantages[moved].sign(), own[moved].sign()), (rewards, token_rewards)


def test_partial_accepts_alone_train_normalised_with_a_loss_of_ordinary_size(served, tiny_starter_model, tmp_path):
    """The window of the test below, with ``normalize_advantages``: the policy loss stays of the
    size of the advantages (about 1), not the 1e7 that dividing by the scalar rewards' spread made."""
    samples = [_sample(served, reward=PARTIAL, token_rewards=[ACCEPTED, ACCEPTED, REJECTED, 0.0])] * 8
    config = FAST.replace(normalize_advantages=True, epochs=1)
    result = train_ppo(config, typed(samples), base_model_dir=tiny_starter_model, out_dir=tmp_path / "out",
                       progress=False)
    metrics = [json.loads(line) for line in (result.out_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(abs(m["policy_loss"]) < 2 for m in metrics), [m["policy_loss"] for m in metrics]


def test_per_token_advantages_push_each_token_its_own_way():
    """At ratio 1 the gradient on each token is −its advantage / tokens: kept tokens are pushed up,
    the refused one down, padding not at all."""
    new = torch.tensor([[0.0, -1.0, -2.0, -1.5]], requires_grad=True)
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    advantages = torch.tensor([[9.0, 0.5, -0.5, -0.25]])
    loss, _, _ = clipped_policy_loss(
        new, new.detach(), advantages, mask, torch.ones(1, 4), clip_eps=0.2, aggregation="token_mean"
    )
    loss.backward()
    assert torch.allclose(new.grad, torch.tensor([[0.0, -0.5, 0.5, 0.25]]) / 3)


def _sha256(path) -> str:
    return hashlib.sha256((path / "adapter_model.safetensors").read_bytes()).hexdigest()


def test_token_rewards_equal_to_the_samples_reward_train_the_same_adapter_as_none(served, tiny_starter_model, tmp_path):
    """Token-level credit is the per-sequence estimator when every token carries the sample's own
    reward: the same baseline, the same scale, the same adapter bytes. Mixed with samples that have
    no token rewards, on completions of 2 to 4 tokens (padded passes)."""
    rewards = [0.75, -0.25, 0.25, 0.0] * 2
    plain = [
        {**_sample(served, reward=reward), "completion_token_ids": served["completion"][: 2 + i % 3]}
        for i, reward in enumerate(rewards)
    ]
    credited = [
        {**s, "token_rewards": [s["reward"]] * len(s["completion_token_ids"])} if i % 2 else s
        for i, s in enumerate(plain)
    ]
    config = FAST.replace(normalize_advantages=True, epochs=2)
    a = train_ppo(config, typed(plain), base_model_dir=tiny_starter_model, out_dir=tmp_path / "plain", progress=False)
    b = train_ppo(
        config, typed(credited), base_model_dir=tiny_starter_model, out_dir=tmp_path / "credited", progress=False
    )
    assert _sha256(a.out_dir) == _sha256(b.out_dir)
    assert (a.summary["token_credit_samples"], b.summary["token_credit_samples"]) == (0, 4)


def test_partial_accept_raises_the_kept_tokens_and_lowers_the_first_untaken_one(served, tiny_starter_model, tmp_path):
    """The user took "return a" of "return a + b": "return" and " a" earn the accepted reward, " +"
    the rejected one, " b" nothing. With one scalar reward for all four tokens (the partial
    reward, the same for every sample) every advantage would be 0 and nothing would move; token by
    token, the kept tokens rise and the refused one falls. Margins: across seeds 0-2 the kept
    tokens rose by 0.8-1.6 nats each and " +" fell by 0.58-0.85."""
    samples = [_sample(served, reward=PARTIAL, token_rewards=[ACCEPTED, ACCEPTED, REJECTED, 0.0])] * 8
    result = train_ppo(
        FAST, typed(samples), base_model_dir=tiny_starter_model, out_dir=tmp_path / "out", progress=False
    )
    after = completion_logprobs(load(tiny_starter_model, result.out_dir), served["prompt"], served["completion"])
    before = served["base"]
    assert after[0] > before[0] + 0.3 and after[1] > before[1] + 0.3, (before, after)
    assert after[2] < before[2] - 0.2, (before, after)
    assert result.summary["token_credit_samples"] == 8

    scalar_only = [{k: v for k, v in s.items() if k != "token_rewards"} for s in samples]
    unmoved = train_ppo(
        FAST, typed(scalar_only), base_model_dir=tiny_starter_model, out_dir=tmp_path / "scalar", progress=False
    )
    still = completion_logprobs(load(tiny_starter_model, unmoved.out_dir), served["prompt"], served["completion"])
    assert max(abs(x - y) for x, y in zip(still, before, strict=True)) < 1e-4, (before, still)
