"""Completion log-probs of a padded batch: the one log-prob function of the trainer (old, new,
reference and scoring all use it), its variant that also reads π(silent), and the entropy.

Only logits at completion positions are computed, and softmaxes go row by row: temporaries are
[W, V] at most, never [B, W, V] beyond the logits themselves.
"""

from __future__ import annotations

import torch

from gpu_trainer.batching import PaddedBatch


def completion_logits(model, batch: PaddedBatch) -> torch.Tensor:
    """Logits at the completion positions only, [B, W, V] in fp32: position t predicts token t+1,
    and ``logits_to_keep`` spares the LM head every prompt position."""
    inputs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                  position_ids=batch.position_ids, use_cache=False)
    try:
        out = model(**inputs, logits_to_keep=batch.width + 1)
    except TypeError:  # an architecture without logits_to_keep: full logits, same slice below
        out = model(**inputs)
    return out.logits[:, -(batch.width + 1):-1, :].float()


def chosen_token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log p(target), logsumexp) at every position of ``logits`` [B, W, V], without a
    [B, W, V] log-softmax: the chosen logit minus the logsumexp (the idea of TRL's selective
    log-softmax). The logsumexp goes row by row, so its temporaries are [W, V] at most."""
    lse = torch.stack([torch.logsumexp(row, dim=-1) for row in logits])
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse, lse


def entropy_from_logits(logits: torch.Tensor, lse: torch.Tensor) -> torch.Tensor:
    """Per-position entropy [B, W] (detached), computed row by row: [W, V] temporaries at most."""
    with torch.no_grad():
        rows = []
        for row_logits, row_lse in zip(logits.detach(), lse.detach(), strict=True):
            log_probs = row_logits - row_lse.unsqueeze(-1)
            rows.append(-(log_probs.exp() * log_probs).sum(-1))
        return torch.stack(rows)


def completion_logprobs(model, batch: PaddedBatch, *, with_entropy: bool = False
                        ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the completion tokens under ``model`` ([B, W], zero off-mask), and the
    per-token entropy of the policy there (detached) when asked.

    The one log-prob function of the trainer: old, new, reference and scoring all use it.
    """
    logprobs, entropy, _ = _logprobs_from_logits(completion_logits(model, batch), batch, with_entropy)
    return logprobs, entropy


def completion_and_silence_logprobs(model, batch: PaddedBatch, *, silent_ids: torch.Tensor, with_entropy: bool = False
                                    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """``completion_logprobs`` plus, from the same forward pass, the log-probability that the first
    token is one of ``silent_ids`` at each row's first completion position ([B]): the probability
    of showing nothing where the served completion began."""
    logits = completion_logits(model, batch)
    logprobs, entropy, lse = _logprobs_from_logits(logits, batch, with_entropy)
    rows = torch.arange(logits.shape[0], device=logits.device)
    first = batch.width - batch.mask.sum(-1).long()  # completions are end-aligned
    silent = torch.logsumexp(logits[rows, first][:, silent_ids], dim=-1) - lse[rows, first]
    return logprobs, entropy, silent


def _logprobs_from_logits(logits: torch.Tensor, batch: PaddedBatch, with_entropy: bool
                          ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    token_logprobs, lse = chosen_token_logprobs(logits, batch.targets)
    entropy = entropy_from_logits(logits, lse) * batch.mask if with_entropy else None
    return token_logprobs * batch.mask, entropy, lse
