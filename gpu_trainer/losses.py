"""The update's arithmetic, shared by PPO and GRPO: advantages, the masked means that let a
minibatch be cut into passes, the clipped surrogate and the KL to the reference.

Pure tensor functions: no model, no config object.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def compute_advantages(rewards: torch.Tensor, *, baseline: str, normalize: bool) -> torch.Tensor:
    """advantage = reward − baseline, optionally divided by its standard deviation."""
    advantages = rewards - rewards.mean() if baseline == "batch_mean" else rewards.clone()
    if normalize and advantages.numel() > 1:
        advantages = advantages / (advantages.std() + 1e-8)
    return advantages


def token_advantages(token_rewards: Sequence[Sequence[float] | None], rewards: torch.Tensor, *, baseline: str,
                     normalize: bool) -> list[torch.Tensor | None]:
    """Per-token advantages of the samples that carry token rewards (None for the others), on
    the scale of ``compute_advantages``: the same baseline (the batch mean of the samples' scalar
    rewards) is taken from each token's reward, and the same divisor (the standard deviation of
    the per-sequence advantages) applies. So a sample whose every token carries its scalar
    reward gets exactly the advantage it would get without token rewards, on every token."""
    centre = rewards.mean() if baseline == "batch_mean" else None
    scale = None
    if normalize and rewards.numel() > 1:
        scale = (rewards - centre if centre is not None else rewards).std() + 1e-8
    out: list[torch.Tensor | None] = []
    for values in token_rewards:
        if values is None:
            out.append(None)
            continue
        advantages = torch.tensor(values, dtype=rewards.dtype)
        if centre is not None:
            advantages = advantages - centre
        out.append(advantages / scale if scale is not None else advantages)
    return out


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


KL_TOKEN_CAP = 10.0
"""The most one token adds to the KL to the reference (its k3 term), in the loss and the figure."""


def kl_to_reference(new_logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimator of KL(policy ‖ reference), always ≥ 0, each token's term capped at
    ``KL_TOKEN_CAP``.

    k3 = r − 1 − log r with r = π_ref / π is unbiased on tokens the policy itself samples. The
    trainer's tokens were sampled by the serving version, so a token the update has all but ruled
    out, where the reference still likes it, makes r huge: one such token (r ≈ e^15) once made a
    step's mean 811 and its gradient all about that token. Capped, as verl's low-variance KL does,
    such a token adds at most the cap and no gradient; the log-ratio is clamped first so exp never
    overflows into a NaN gradient."""
    delta = (ref_logprobs - new_logprobs).clamp(-20.0, 20.0)
    return (delta.exp() - delta - 1).clamp(max=KL_TOKEN_CAP)
