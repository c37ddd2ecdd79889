"""Samples into forward passes: the token-budget plan and the padded batch of one pass.

Memory is bounded by a token budget, not by the number of samples: ``plan_micro_batches`` cuts
a set of samples into forward passes of at most ``max_tokens`` tokens each (rows × padded
length), shortest first so that similar lengths share a pass. The activations of one pass grow
with its tokens (SmolLM2-135M: ~1.2 MB per token with grad), so the budget bounds them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from learning_shared.samples import Sample


@dataclass
class PaddedBatch:
    """Left-padded prompt+completion sequences; completions end-aligned in the last ``width`` slots.

    Left padding puts every completion at the end, so the model computes logits for only the
    last ``width + 1`` positions (``logits_to_keep``) instead of the whole sequence.
    """

    input_ids: torch.Tensor  # [B, T]
    attention_mask: torch.Tensor  # [B, T]
    position_ids: torch.Tensor  # [B, T]
    targets: torch.Tensor  # [B, W] completion token ids, end-aligned
    mask: torch.Tensor  # [B, W] float, 1 on completion tokens
    behaviour_logprobs: torch.Tensor  # [B, W], 0 where unknown
    behaviour_mask: torch.Tensor  # [B, W] float, 1 where the serving logprob is known
    num_tokens: int  # non-pad tokens in the batch (prompt + completion)

    @property
    def width(self) -> int:
        return self.targets.shape[1]


def completion_tokens(sample: Sample, eos_id: int) -> tuple[int, ...]:
    """The tokens the trainer learns on: the served ones, or ``[eos]`` for silence."""
    return sample.completion_token_ids or (eos_id,)


def sequence_length(sample: Sample, *, eos_id: int, max_prompt_tokens: int) -> int:
    """Tokens of ``sample`` in a forward pass: its (truncated) prompt plus its completion."""
    return min(len(sample.prompt_token_ids), max_prompt_tokens) + len(completion_tokens(sample, eos_id))


def truncated_prompts(samples: Sequence[Sample], *, max_prompt_tokens: int) -> int:
    """How many of ``samples`` have a prompt longer than ``max_prompt_tokens``: ``make_batch`` keeps
    only its last ``max_prompt_tokens`` tokens, so such a sample is trained on (or judged on) a
    context that was never served (a long FIM prompt loses its leading ``<|fim_prefix|>``, and with
    a long suffix its ``<|fim_suffix|>`` as well)."""
    return sum(1 for s in samples if len(s.prompt_token_ids) > max_prompt_tokens)


def plan_micro_batches(lengths: Sequence[int], indices: Sequence[int], *, max_tokens: int,
                       max_rows: int | None = None) -> list[list[int]]:
    """Cut ``indices`` (into ``lengths``) into forward passes of at most ``max_tokens`` tokens,
    padding included (rows × longest row), and at most ``max_rows`` rows.

    Sorted by length first (ties by index, so the plan is deterministic): a pass then holds
    similar lengths and pads little. A sequence longer than ``max_tokens`` gets a pass of its own.
    """
    ordered = sorted(indices, key=lambda i: (lengths[i], i))
    passes: list[list[int]] = []
    current: list[int] = []
    for index in ordered:
        # Ascending order: the row being added is the longest of its pass.
        rows = len(current) + 1
        if current and (rows * lengths[index] > max_tokens or (max_rows is not None and rows > max_rows)):
            passes.append(current)
            current = []
        current.append(index)
    if current:
        passes.append(current)
    return passes


def make_batch(samples: list[Sample], *, eos_id: int, pad_id: int, max_prompt_tokens: int,
               device: torch.device) -> PaddedBatch:
    """Pad ``samples`` into one batch (prompts truncated from the left, ``truncated_prompts``)."""
    completions = [completion_tokens(s, eos_id) for s in samples]
    sequences = [
        list(s.prompt_token_ids[-max_prompt_tokens:]) + list(c)
        for s, c in zip(samples, completions, strict=True)
    ]
    length = max(len(seq) for seq in sequences)
    width = max(len(c) for c in completions)
    batch = len(samples)
    input_ids = torch.full((batch, length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((batch, length), dtype=torch.long)
    mask = torch.zeros((batch, width))
    behaviour = torch.zeros((batch, width))
    behaviour_mask = torch.zeros((batch, width))
    for row, (sample, seq, comp) in enumerate(zip(samples, sequences, completions, strict=True)):
        input_ids[row, length - len(seq):] = torch.tensor(seq)
        attention_mask[row, length - len(seq):] = 1
        mask[row, width - len(comp):] = 1
        if sample.behaviour_logprobs is not None:
            behaviour[row, width - len(comp):] = torch.tensor(sample.behaviour_logprobs)
            behaviour_mask[row, width - len(comp):] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return PaddedBatch(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        position_ids=position_ids.to(device),
        targets=input_ids[:, length - width:].to(device),
        mask=mask.to(device),
        behaviour_logprobs=behaviour.to(device),
        behaviour_mask=behaviour_mask.to(device),
        num_tokens=int(attention_mask.sum()),
    )
