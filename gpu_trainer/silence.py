"""The counterfactual silent action (``PPOConfig.silence_counterfactual``): its loss.

Which first tokens are silent comes from the samples (``samples.silent_token_ids``); their
log-probability from the update's own forward pass (``logprobs.completion_and_silence_logprobs``).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gpu_trainer.config import PPOConfig
from learning_shared.samples import Sample


def silence_loss(new_silent: torch.Tensor, old_silent: torch.Tensor, advantages: torch.Tensor, *, clip: float,
                 denominator: int) -> torch.Tensor:
    """The counterfactual silent action's loss, this pass's share of the minibatch's.

    A policy-gradient step in log space (gradient advantage × ∇ log π(silent), as large for a
    2 % action as for a likely one) within a total-variation trust region: a row stops pushing
    once π(silent) has moved by ``clip`` (absolute) in its advantage's direction. The ratio clip
    of the sampled tokens would instead scale the step by π and stop a 2 % action at 2.4 %.
    """
    with torch.no_grad():
        moved = new_silent.exp() - old_silent.exp()
        active = torch.where(advantages > 0, moved < clip, moved > -clip).float()
    return -(advantages * new_silent * active).sum() / max(denominator, 1)


def counterfactual_advantages(
    samples: Sequence[Sample], rewards: torch.Tensor, config: PPOConfig
) -> torch.Tensor | None:
    """Each event's counterfactual silent action (None when ``silence_counterfactual`` is off): its
    reward (the sample's own ``silence_reward``, an agent's turn, else the config's) minus the
    event's; 0 for a completion with ``silence_gated`` (no gradient to its silent action)."""
    if not config.silence_counterfactual:
        return None
    silent = [config.silence_reward if s.silence_reward is None else s.silence_reward for s in samples]
    advantages = torch.tensor(silent, dtype=torch.float32) - rewards
    if config.silence_gated:  # the show filter keeps completions silent: only agents' turns learn it here
        taught = torch.tensor([s.silence_reward is not None for s in samples])
        advantages = torch.where(taught, advantages, torch.zeros_like(advantages))
    return advantages
