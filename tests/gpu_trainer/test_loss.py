"""The PPO loss pieces on hand-made tensors: baseline, clipping, importance weights, KL."""

from __future__ import annotations

import math

import pytest
import torch

from gpu_trainer.losses import KL_LINEAR_FROM, clipped_policy_loss, compute_advantages, kl_to_reference, masked_mean


def test_baseline_none_keeps_raw_rewards_and_batch_mean_centres_them():
    rewards = torch.tensor([0.75, -0.25, -0.25, 0.0])
    assert compute_advantages(rewards, baseline="none", normalize=False).tolist() == rewards.tolist()
    centred = compute_advantages(rewards, baseline="batch_mean", normalize=False)
    assert abs(float(centred.sum())) < 1e-6
    normalized = compute_advantages(rewards, baseline="batch_mean", normalize=True)
    assert abs(float(normalized.std()) - 1.0) < 1e-4


@pytest.mark.parametrize("rewards", [[0.25] * 3, [0.1] * 7, [0.7] * 3])
def test_normalising_rewards_that_do_not_spread_divides_by_nothing(rewards):
    """All alike: normalised, seven rewards of 0.1 became −0.75 each (their mean's rounding, 7e-9,
    over its own spread) and 0.7s under ``baseline: none`` 7e7; now they stay as they are."""
    rewards = torch.tensor(rewards)
    centred = compute_advantages(rewards, baseline="batch_mean", normalize=True)
    assert torch.equal(centred, rewards - rewards.mean()) and centred.abs().max() < 1e-7
    assert torch.equal(compute_advantages(rewards, baseline="none", normalize=True), rewards)


def test_at_ratio_one_the_gradient_is_minus_advantage_times_the_logprob_gradient():
    new = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    old = new.detach().clone()
    loss, approx_kl, clip_fraction = clipped_policy_loss(
        new, old, torch.tensor([0.5]), torch.ones(1, 2), torch.ones(1, 2), clip_eps=0.2, aggregation="token_mean"
    )
    loss.backward()
    assert torch.allclose(new.grad, torch.tensor([[-0.25, -0.25]]))
    assert float(approx_kl) == 0.0 and float(clip_fraction) == 0.0


def test_clipping_stops_the_gradient_once_the_ratio_left_the_trust_region_in_the_advantage_direction():
    old = torch.tensor([[-1.0, -1.0]])
    new = (old + torch.tensor([[0.5, -0.5]])).requires_grad_(True)  # ratios e^0.5 and e^-0.5
    loss, _, clip_fraction = clipped_policy_loss(
        new, old, torch.tensor([1.0]), torch.ones(1, 2), torch.ones(1, 2), clip_eps=0.2, aggregation="token_mean"
    )
    loss.backward()
    assert new.grad[0, 0] == 0  # already pushed up past 1 + eps: no more
    assert new.grad[0, 1] < 0  # pushed down against the advantage: still corrected
    assert float(clip_fraction) == 1.0


def test_importance_weights_scale_tokens_and_padding_is_ignored():
    new = torch.tensor([[0.0, -1.0, -1.0]], requires_grad=True)
    mask = torch.tensor([[0.0, 1.0, 1.0]])
    weights = torch.tensor([[1.0, 2.0, 0.5]])
    loss, _, _ = clipped_policy_loss(
        new, new.detach(), torch.tensor([1.0]), mask, weights, clip_eps=0.2, aggregation="token_mean"
    )
    loss.backward()
    assert torch.allclose(new.grad, torch.tensor([[0.0, -1.0, -0.25]]))


def test_sequence_mean_weighs_each_completion_equally():
    values = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 3.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 1.0]])
    assert float(masked_mean(values, mask, "token_mean")) == 1.5
    assert float(masked_mean(values, mask, "sequence_mean")) == 2.0


def test_kl_estimator_is_zero_at_the_reference_and_positive_elsewhere():
    ref = torch.tensor([-1.0, -2.0])
    assert torch.equal(kl_to_reference(ref, ref), torch.zeros(2))
    assert (kl_to_reference(ref + torch.tensor([0.3, -0.3]), ref) > 0).all()


def test_kl_estimator_is_exact_k3_up_to_the_linear_part_and_on_the_other_side():
    new = torch.tensor([-1.3, -1.7, -1.0 - KL_LINEAR_FROM + 0.01, -0.5])
    ref = torch.tensor([-1.0, -2.0, -1.0, -9.0])  # the last: the policy far likelier (k3 linear there)
    delta = ref - new
    assert torch.allclose(kl_to_reference(new, ref), delta.exp() - delta - 1)


def test_a_token_pushed_far_below_the_reference_adds_linearly_with_a_bounded_gradient():
    # 999 tokens where the policy matches the reference, one it has pushed to e^-16 while the
    # reference gives it e^-1: exact k3 there is e^15 (~3.3 million), and the mean over 1000 ~3,270.
    ref = torch.full((1000,), -1.0)
    new = ref.clone()
    new[0] = -16.0
    new.requires_grad_(True)
    per_token = kl_to_reference(new, ref)
    slope = math.exp(KL_LINEAR_FROM) - 1
    at_bend = math.exp(KL_LINEAR_FROM) - KL_LINEAR_FROM - 1
    assert float(per_token[0].detach()) == pytest.approx(at_bend + slope * (15 - KL_LINEAR_FROM), rel=1e-5)
    assert 0.2 < float(per_token.detach().mean()) < 0.3  # still shows, no longer swamps
    per_token.sum().backward()
    assert float(new.grad[0]) == pytest.approx(-slope, rel=1e-5)  # descent pulls it back up, at a bounded rate
    assert float(new.grad[1:].abs().max()) == 0.0


def test_kl_estimator_value_and_gradient_stay_finite_where_exp_would_overflow():
    new = torch.tensor([-200.0], requires_grad=True)
    value = kl_to_reference(new, torch.tensor([-0.5]))
    value.sum().backward()
    assert torch.isfinite(value.detach()).all() and torch.isfinite(new.grad).all()
