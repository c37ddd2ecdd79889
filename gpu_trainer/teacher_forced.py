"""Teacher-forced comparison of two adapters on the same completions (the gate's KL and
off-policy reward checks): per-sample log-probs under each, and the full-vocabulary KL.

Memory holds one base model with both adapters (named peft adapters, switched with
``set_adapter``; None is the base model alone). Passes are cut by the token budget, and only
logits at completion positions are computed; softmaxes go row by row.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from gpu_trainer.batching import make_batch, plan_micro_batches, sequence_length
from gpu_trainer.logprobs import chosen_token_logprobs, completion_logits
from gpu_trainer.memory import release_freed_memory
from learning_shared.samples import Sample


@contextmanager
def active_adapter(model, adapter: str | None) -> Iterator[None]:
    """Run the block with ``adapter`` active; None is the base model (adapters disabled)."""
    if adapter is None:
        with model.disable_adapter():
            yield
    else:
        model.set_adapter(adapter, inference_mode=True)
        yield


def _kl_per_position(
    first: torch.Tensor, first_lse: torch.Tensor, second: torch.Tensor, second_lse: torch.Tensor
) -> torch.Tensor:
    """KL(first ‖ second) at each position [B, W] from logits [B, W, V], row by row."""
    rows = []
    for a, a_lse, b, b_lse in zip(first, first_lse, second, second_lse, strict=True):
        log_a = a - a_lse.unsqueeze(-1)
        rows.append((log_a.exp() * (log_a - (b - b_lse.unsqueeze(-1)))).sum(-1))
    return torch.stack(rows)


def teacher_forced(
    model,
    samples: list[Sample],
    candidate: str,
    parent: str | None,
    *,
    eos_id: int,
    pad_id: int,
    max_prompt_tokens: int,
    max_tokens_per_pass: int,
    max_rows: int,
    device: torch.device,
) -> dict[str, Any]:
    """Per-sample completion log-probs under ``candidate`` and ``parent`` ([N] float64, input
    order) and KL(candidate ‖ parent) summed over all completion positions, with their count."""
    count = len(samples)
    logp_candidate = torch.zeros(count, dtype=torch.float64)
    logp_parent = torch.zeros(count, dtype=torch.float64)
    kl_sum, positions = 0.0, 0
    lengths = [sequence_length(s, eos_id=eos_id, max_prompt_tokens=max_prompt_tokens) for s in samples]
    with torch.inference_mode():
        for rows in plan_micro_batches(lengths, range(count), max_tokens=max_tokens_per_pass, max_rows=max_rows):
            batch = make_batch(
                [samples[i] for i in rows],
                eos_id=eos_id,
                pad_id=pad_id,
                max_prompt_tokens=max_prompt_tokens,
                device=device,
            )
            with active_adapter(model, candidate):
                cand = completion_logits(model, batch)
            with active_adapter(model, parent):
                par = completion_logits(model, batch)
            mask = batch.mask
            cand_logp, cand_lse = chosen_token_logprobs(cand, batch.targets)
            par_logp, par_lse = chosen_token_logprobs(par, batch.targets)
            kl_sum += float((_kl_per_position(cand, cand_lse, par, par_lse) * mask).sum())
            positions += int(mask.sum())
            index = torch.tensor(rows)
            logp_candidate[index] = (cand_logp * mask).sum(-1).double().cpu()
            logp_parent[index] = (par_logp * mask).sum(-1).double().cpu()
            del cand, par
            release_freed_memory()
    return {"logp_candidate": logp_candidate, "logp_parent": logp_parent, "kl_sum": kl_sum, "positions": positions}


def off_policy_value(
    logp_policy: torch.Tensor, logp_behaviour: torch.Tensor, rewards: torch.Tensor, *, cap: float
) -> tuple[float, float]:
    """Self-normalised, clipped importance-sampling estimate of the policy's mean reward.

    w = clip(exp(log π − log β), 0, cap); V = Σ w·r / Σ w. Returns (V, effective sample size);
    V is NaN when every weight underflows to 0 (the policy never produces the logged completions).
    """
    weights = torch.exp(logp_policy - logp_behaviour).clamp(0.0, cap)
    total = weights.sum()
    if not total > 0:
        return math.nan, 0.0
    return float((weights * rewards).sum() / total), float(total**2 / (weights**2).sum())
