"""What one PPO update works on, and the figures it reports: a minibatch and its forward passes
(``Minibatch``, ``Pass``), the sums its passes add up to before its step (``RunningFigures``), the
metrics row of each optimizer step (``step_metrics``) and the run's summary (``summarize``).

The loop that fills them is ``policy_update.run_policy_update``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from gpu_trainer.config import PPOConfig
from gpu_trainer.preference import PairPass
from learning_shared.samples import Sample


def std(values: torch.Tensor) -> float:
    return float(values.std()) if values.numel() > 1 else 0.0


@dataclass
class Pass:
    """One forward pass of a minibatch: its samples and what is kept of them between passes."""

    rows: list[int]  # sample indices, shortest first
    advantages: torch.Tensor  # [b], or [b, W] (end-aligned like the batch) when a row has token-level credit
    old: torch.Tensor | None = None  # [b, W] log-probs before the update (None until computed)
    reference: torch.Tensor | None = None  # [b, W] log-probs of the base model, when measured
    weights: torch.Tensor | None = None  # [b, W] importance weights
    mismatch_sum: float = 0.0  # Σ|old − behaviour| over the tokens whose serving log-prob is known
    mismatch_tokens: int = 0  # those tokens
    silence_advantages: torch.Tensor | None = None  # [b] with silence_counterfactual
    old_silent: torch.Tensor | None = None  # [b] log π_old(a silent first token), with silence_counterfactual


@dataclass
class Minibatch:
    passes: list[Pass]
    tokens: int  # completion tokens (the token_mean denominator)
    sequences: int  # samples (the sequence_mean denominator)
    rewards: torch.Tensor
    advantages: torch.Tensor
    pairs: list[PairPass]  # its edits' kept-versus-shown pairs, with preference_coef


@dataclass
class RunningFigures:
    """What a minibatch's passes add up to before its step: each pass adds its share."""

    # Summed in float64, one device read-back per pass (``add``).
    policy_loss: float = 0.0
    loss: float = 0.0
    approx_kl: float = 0.0
    clip_fraction: float = 0.0
    entropy: float = 0.0
    kl_to_base: float = 0.0  # NaN when the reference is not measured
    silence_loss: float = 0.0
    silence_prob_sum: float = 0.0  # Σ π(silent) over the rows; NaN without silence_counterfactual
    preference_loss: float = 0.0
    preference_margin_sum: float = 0.0  # Σ over the pairs of the kept text's gain on the shown one
    # Summed on the host.
    importance_weight_sum: float = 0.0  # over completion tokens
    tokens: int = 0  # every non-pad token of the passes

    def add(self, **shares: torch.Tensor) -> None:
        """Add one pass's shares (scalar tensors named as the fields), read back together."""
        values = torch.stack(list(shares.values())).double().cpu().tolist()
        for name, value in zip(shares, values, strict=True):
            setattr(self, name, getattr(self, name) + value)


def step_metrics(
    figures: RunningFigures,
    minibatch: Minibatch,
    *,
    grad_norm: float,
    elapsed: float,
    config: PPOConfig,
    kl_measured: bool,
    silence: bool,
) -> dict[str, Any]:
    """The logged figures of one optimizer step (after its step, epoch and minibatch)."""
    mismatch_sum = sum(p.mismatch_sum for p in minibatch.passes)
    mismatch_tokens = sum(p.mismatch_tokens for p in minibatch.passes)
    pairs = sum(len(p.rows) for p in minibatch.pairs)
    preference = config.preference_coef > 0
    return {
        "policy_loss": figures.policy_loss,
        "loss": figures.loss,
        "approx_kl": figures.approx_kl,
        "clip_fraction": figures.clip_fraction,
        "entropy": figures.entropy,
        "grad_norm": grad_norm,
        "kl_to_base": figures.kl_to_base if kl_measured else None,
        "silence_loss": figures.silence_loss if silence else None,
        "silence_prob": figures.silence_prob_sum / minibatch.sequences if silence else None,
        "preference_loss": figures.preference_loss if preference else None,
        "preference_pairs": pairs if preference else None,
        "preference_margin": figures.preference_margin_sum / pairs if preference and pairs else None,
        "reward_mean": float(minibatch.rewards.mean()),
        "reward_std": std(minibatch.rewards),
        "advantage_mean": float(minibatch.advantages.mean()),
        "advantage_std": std(minibatch.advantages),
        "logprob_mismatch": mismatch_sum / mismatch_tokens if mismatch_tokens else None,
        "importance_weight_mean": figures.importance_weight_sum / max(minibatch.tokens, 1),
        "samples": minibatch.sequences,
        "completion_tokens": minibatch.tokens,
        "tokens": figures.tokens,
        "passes": len(minibatch.passes),
        "tokens_per_s": figures.tokens / elapsed,
        "learning_rate": config.learning_rate,
    }


def summarize(metrics: list[dict[str, Any]], samples: list[Sample], wall_seconds: float, tokens: int) -> dict[str, Any]:
    """The run's summary (stored with its adapter) from the metrics rows of its updates."""
    rewards = torch.tensor([s.reward for s in samples])
    last = metrics[-1] if metrics else {}
    return {
        "samples": len(samples),
        "token_credit_samples": sum(1 for s in samples if s.token_rewards is not None),
        "steps": len(metrics),
        "reward_mean": float(rewards.mean()),
        "reward_std": std(rewards),
        "final_policy_loss": last.get("policy_loss"),
        "final_approx_kl": last.get("approx_kl"),
        "final_kl_to_base": last.get("kl_to_base"),
        "mean_clip_fraction": sum(m["clip_fraction"] for m in metrics) / len(metrics) if metrics else None,
        "wall_seconds": round(wall_seconds, 3),
        "tokens_per_s": tokens / wall_seconds if wall_seconds > 0 else None,
    }
