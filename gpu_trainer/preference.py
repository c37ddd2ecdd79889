"""An edit's pairwise loss: the text the user kept, preferred to the completion they were shown.

An edit says more than which served tokens were right: the user wrote, in the suggestion's place,
what they wanted. Its sample carries that text as tokens (``preferred_token_ids``). With
``preference_coef`` > 0, every update adds to PPO's loss, for each such sample of a minibatch, a
pairwise logistic loss of the two continuations of the same prompt (the form of DPO, with the
policy before this update as the reference):

    coef · softplus(−β · [(log π(kept) − log π_old(kept)) − (log π(shown) − log π_old(shown))])

over the minibatch's sample count (one event weighs as one sample of the minibatch), where
log π(·) is the summed log-probability of a continuation. At the update's start the margin is 0
and the loss pushes log π(kept) up and log π(shown) down with weight coef · β / 2; the push fades
as the kept text gains on the shown one. Tokens the two share at their start (the kept prefix)
cancel. The kept text's tokens are the base tokenizer's for that text alone, and nothing follows
them: where the user's line ends is not something an editor reports.

Pure functions over a model and samples; ``policy_update`` calls them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gpu_trainer.batching import PaddedBatch, make_batch, plan_micro_batches
from gpu_trainer.config import PPOConfig
from gpu_trainer.logprobs import completion_logprobs
from gpu_trainer.model_loading import Policy
from gpu_trainer.precision import forward_precision
from learning_shared.samples import Sample


def preference_rows(samples: Sequence[Sample]) -> list[int]:
    """The samples that carry a kept text other than their completion: each is one pair."""
    return [
        i for i, s in enumerate(samples)
        if s.preferred_token_ids is not None and s.preferred_token_ids != s.completion_token_ids
    ]


def _preferred(sample: Sample) -> Sample:
    """The same prompt, continued with the kept text instead of the served completion."""
    assert sample.preferred_token_ids is not None
    return Sample(prompt_token_ids=sample.prompt_token_ids, completion_token_ids=sample.preferred_token_ids,
                  behaviour_logprobs=None, reward=sample.reward)


@dataclass
class PairPass:
    """One forward pass of pairs: their rows, and the two continuations' summed log-probs before
    the update ([b] each), once measured."""

    rows: list[int]
    old_kept: torch.Tensor | None = None
    old_shown: torch.Tensor | None = None


def plan_pair_passes(samples: Sequence[Sample], rows: Sequence[int], *, max_prompt_tokens: int,
                     max_tokens: int) -> list[PairPass]:
    """``rows`` cut into passes of at most ``max_tokens`` tokens for the two continuations
    together (each row counted at the longer of its two, padding included): both go in one batch."""
    lengths = [0] * len(samples)
    for i in rows:
        longer = max(len(samples[i].completion_token_ids), len(samples[i].preferred_token_ids or ()))
        lengths[i] = min(len(samples[i].prompt_token_ids), max_prompt_tokens) + longer
    return [PairPass(part) for part in plan_micro_batches(lengths, list(rows), max_tokens=max(1, max_tokens // 2))]


def pair_batch(samples: Sequence[Sample], rows: Sequence[int], *, eos_id: int, pad_id: int, max_prompt_tokens: int,
               device: torch.device) -> PaddedBatch:
    """One padded batch of the kept continuations of ``rows``, then their shown ones."""
    continuations = [_preferred(samples[i]) for i in rows] + [samples[i] for i in rows]
    return make_batch(continuations, eos_id=eos_id, pad_id=pad_id, max_prompt_tokens=max_prompt_tokens,
                      device=device)


def sequence_logprobs(model, batch: PaddedBatch) -> torch.Tensor:
    """The summed log-probability of each row's continuation ([B])."""
    return completion_logprobs(model, batch)[0].sum(-1)


def pair_logprobs(policy: Policy, samples: Sequence[Sample], rows: list[int], config: PPOConfig
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The summed log-probs of the kept and of the shown continuations of ``rows`` under the
    policy as it is now (with grad unless the caller turned it off)."""
    batch = pair_batch(samples, rows, eos_id=policy.eos_id, pad_id=policy.pad_id,
                       max_prompt_tokens=config.max_prompt_tokens, device=policy.device)
    with forward_precision(config, policy.device):
        both = sequence_logprobs(policy.model, batch)
    return both[: len(rows)], both[len(rows):]


def preference_loss(new_kept: torch.Tensor, new_shown: torch.Tensor, old_kept: torch.Tensor, old_shown: torch.Tensor,
                    *, beta: float, coef: float, denominator: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This pass's share of the minibatch's pairwise loss, and its pairs' margins (detached, [b]):
    how much more the kept text gained than the shown one since the update began, in nats."""
    margin = (new_kept - old_kept) - (new_shown - old_shown)
    loss = coef * F.softplus(-beta * margin).sum() / denominator
    return loss, margin.detach()
