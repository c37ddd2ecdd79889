"""The update's arithmetic, shared by PPO and GRPO: advantages, the masked means that let a
minibatch be cut into passes, the clipped surrogate and the KL to the reference.

Pure tensor functions: no model, no config object.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

ADVANTAGE_SPREAD_FLOOR = 1e-6
"""``normalize_advantages`` divides by the advantages' spread only from this spread up. Below it
the advantages are all alike (up to rounding): dividing would make rounding noise a unit-sized
advantage, or, where token rewards differ from rewards that do not, a token's 1e8."""


def compute_advantages(rewards: torch.Tensor, *, baseline: str, normalize: bool,
                       token_rewards: Sequence[Sequence[float] | None] | None = None) -> torch.Tensor:
    """advantage = reward − baseline, optionally divided by the spread of the advantages the update
    uses (``advantage_spread``: ``token_rewards``, where samples carry them, count in it)."""
    advantages = rewards - rewards.mean() if baseline == "batch_mean" else rewards.clone()
    divisor = _divisor(advantages, rewards, token_rewards) if normalize else None
    return advantages / divisor if divisor is not None else advantages


def token_advantages(token_rewards: Sequence[Sequence[float] | None], rewards: torch.Tensor, *, baseline: str,
                     normalize: bool) -> list[torch.Tensor | None]:
    """Per-token advantages of the samples that carry token rewards (None for the others), on
    the scale of ``compute_advantages`` given the same ``token_rewards``: the same baseline (the
    batch mean of the samples' scalar rewards) is taken from each token's reward, and the same
    divisor applies. So a sample whose every token carries its scalar reward gets exactly the
    advantage it would get without token rewards, on every token."""
    centre = rewards.mean() if baseline == "batch_mean" else None
    scalar = rewards - centre if centre is not None else rewards
    divisor = _divisor(scalar, rewards, token_rewards) if normalize else None
    out: list[torch.Tensor | None] = []
    for values in token_rewards:
        if values is None:
            out.append(None)
            continue
        advantages = torch.tensor(values, dtype=rewards.dtype)
        if centre is not None:
            advantages = advantages - centre
        out.append(advantages / divisor if divisor is not None else advantages)
    return out


def advantage_spread(advantages: torch.Tensor, rewards: torch.Tensor,
                     token_rewards: Sequence[Sequence[float] | None] | None = None) -> torch.Tensor:
    """The standard deviation of the advantages the update uses, each sample weighing one.

    ``advantages`` are the scalar ones (reward − baseline). A sample without token rewards counts
    its squared distance (advantage − m)², m the mean of the scalar advantages; a sample with them
    counts the mean of that over its tokens, each token's advantage being its token reward − the
    same baseline. Without token rewards (or with token rewards that all equal their sample's
    reward) this is exactly ``advantages.std()``. With them, a window whose scalar rewards are all
    alike (partial accepts only: 0.25 each) still has the spread of its token rewards, so its
    token advantages are divided by that, never by ~0.
    """
    spread = advantages.std()
    if not token_rewards:
        return spread
    centre = advantages.mean()
    extra = torch.zeros((), dtype=advantages.dtype)
    for index, values in enumerate(token_rewards):
        if values is None:
            continue
        # token advantage − the sample's advantage; exactly 0 where a token carries the sample's reward
        deviation = torch.tensor(values, dtype=rewards.dtype) - rewards[index]
        # (advantage + deviation − m)² − (advantage − m)², the sample's tokens sharing its weight
        extra = extra + (deviation * (2 * (advantages[index] - centre) + deviation)).mean()
    if not extra:
        return spread
    return (spread.square() + extra / (advantages.numel() - 1)).clamp(min=0).sqrt()


def _divisor(advantages: torch.Tensor, rewards: torch.Tensor,
             token_rewards: Sequence[Sequence[float] | None] | None) -> torch.Tensor | None:
    """What ``normalize_advantages`` divides by; None (divide by nothing) for a single sample or a
    spread below ``ADVANTAGE_SPREAD_FLOOR``."""
    if advantages.numel() < 2:
        return None
    spread = advantage_spread(advantages, rewards, token_rewards)
    return spread + 1e-8 if spread >= ADVANTAGE_SPREAD_FLOOR else None


def masked_mean(values: torch.Tensor, mask: torch.Tensor, aggregation: str = "token_mean", *,
                tokens: int | None = None, sequences: int | None = None) -> torch.Tensor:
    """Mean over masked tokens, pooled (``token_mean``) or per sequence first (``sequence_mean``).

    When ``mask`` covers one pass of a larger minibatch, ``tokens`` (its masked token count)
    and ``sequences`` (its rows) are the minibatch's: the result is then this pass's share of the
    minibatch mean, and the shares of its passes add up to that mean exactly.
    """
    if aggregation == "sequence_mean":
        per_sequence = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1)
        return per_sequence.sum() / (sequences if sequences is not None else per_sequence.numel())
    return (values * mask).sum() / (tokens if tokens is not None else mask.sum().clamp(min=1))


def clipped_policy_loss(new_logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                        mask: torch.Tensor, weights: torch.Tensor, *, clip_eps: float, aggregation: str,
                        tokens: int | None = None, sequences: int | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The one PPO loss (PPO and GRPO): token-level clipped surrogate, importance-weighted.

    ``advantages`` is one per sequence ([b], every token shares it) or one per token ([b, W],
    aligned with ``mask``: samples with token-level credit). Returns (loss, approx KL(old ‖ new),
    clip fraction); the last two are detached. ``tokens`` and ``sequences``: as in
    ``masked_mean``, for one pass of a minibatch (all three are then this pass's shares).
    """
    log_ratio = (new_logprobs - old_logprobs) * mask
    ratio = log_ratio.exp()
    adv = advantages.unsqueeze(-1) if advantages.dim() == 1 else advantages
    surrogate = torch.min(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    loss = masked_mean(-surrogate * weights, mask, aggregation, tokens=tokens, sequences=sequences)
    with torch.no_grad():
        approx_kl = masked_mean((ratio - 1) - log_ratio, mask, tokens=tokens)
        clip_fraction = masked_mean(((ratio - 1).abs() > clip_eps).float(), mask, tokens=tokens)
    return loss, approx_kl, clip_fraction


KL_LINEAR_FROM = 3.0
"""Beyond this log-ratio log(π_ref / π) a token's k3 term goes on along its tangent (see below)."""


def kl_to_reference(new_logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(policy ‖ reference), always ≥ 0; exact up to a log-ratio
    log(π_ref / π) of ``KL_LINEAR_FROM``, linear beyond it.

    k3 = r − 1 − log r with r = π_ref / π is unbiased on tokens the policy itself samples. The
    trainer's tokens were sampled by the serving version, so a token the update has pushed far
    below the reference makes r, and its gradient, grow as exp: on a lent H100 two block rounds
    reported a mean of 811.8 and 750.4 over a step's tokens (the gate measured 0.008 and 0.015
    to the parent), and with ``kl_coef`` such a token's gradient would make the clipped step
    almost all about it. Past a log-ratio of 3 (the reference 20 times likelier) the term follows
    its tangent, as a Huber loss bounds a square: it still grows, so the figure still shows such a
    token, and still pulls it back, but with a bounded gradient (e³ − 1 ≈ 19 a token). Below 3,
    and on the other side, where k3 is already linear, nothing changes."""
    delta = ref_logprobs - new_logprobs
    near = delta.clamp(max=KL_LINEAR_FROM)  # exp never sees more than this, so it cannot overflow
    exact = near.exp() - near - 1
    slope = math.exp(KL_LINEAR_FROM) - 1
    return exact + slope * (delta - near)
