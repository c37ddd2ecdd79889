"""Greedy FIM decoding, shared by the gate's FIM check and ``score``: batched, left-padded, cut
into passes by the token budget, each completion cut at its first stop.

A ``plain``-family model sees the prefix alone and has no suffix to stop at, so its completion
runs on past the middle; it is compared on as many lines as the reference middle has.
"""

from __future__ import annotations

from typing import Any

import torch

from gpu_trainer.batching import plan_micro_batches
from gpu_trainer.memory import release_freed_memory
from learning_shared.fim import PLAIN, stop_tokens
from learning_shared.fim_metrics import CaseScore, case_scores, means


def stop_token_ids(tokenizer, family: str | None, eos_id: int) -> list[int]:
    """EOS plus the family's stop tokens that are single tokens of this tokenizer."""
    ids = {eos_id}
    if family is not None:
        vocab = tokenizer.get_vocab()
        ids.update(vocab[t] for t in stop_tokens(family) if t in vocab)
    return sorted(ids)


def cut_at_stop(text: str, family: str | None) -> str:
    for stop in stop_tokens(family) if family else []:
        text = text.split(stop, 1)[0]
    return text


def left_padded(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) of ``prompts`` padded on the left to the longest: generation
    then continues every row from the same position."""
    length = max(len(ids) for ids in prompts)
    input_ids = torch.full((len(prompts), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), length), dtype=torch.long)
    for row, ids in enumerate(prompts):
        input_ids[row, length - len(ids) :] = torch.tensor(ids)
        attention_mask[row, length - len(ids) :] = 1
    return input_ids, attention_mask


def greedy_completions(
    model,
    tokenizer,
    prompts: list[str],
    *,
    family: str | None,
    eos_id: int,
    pad_id: int,
    max_new_tokens: int,
    max_tokens_per_pass: int,
    max_rows: int | None = None,
    device: torch.device | str,
) -> list[str]:
    """Greedy completions of ``prompts`` (in their order), each cut at its first stop token.

    Prompts of similar length share a pass; a pass holds at most ``max_tokens_per_pass`` tokens
    counting each prompt plus ``max_new_tokens`` (and at most ``max_rows`` prompts).
    """
    stops = stop_token_ids(tokenizer, family, eos_id)
    encoded = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    lengths = [len(ids) + max_new_tokens for ids in encoded]
    completions: list[str] = [""] * len(prompts)
    for rows in plan_micro_batches(lengths, range(len(prompts)), max_tokens=max_tokens_per_pass, max_rows=max_rows):
        input_ids, attention_mask = left_padded([encoded[i] for i in rows], pad_id)
        length = input_ids.shape[1]
        with torch.inference_mode():
            output = model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention_mask.to(device),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=stops,
                pad_token_id=pad_id,
            )
        for index, generated in zip(rows, output[:, length:].tolist(), strict=True):
            end = next((i for i, t in enumerate(generated) if t in stops), len(generated))
            completions[index] = cut_at_stop(tokenizer.decode(generated[:end], skip_special_tokens=False), family)
        del output
        release_freed_memory()
    return completions


def comparable(completion: str, reference: str, family: str | None) -> str:
    """The part of ``completion`` to compare with ``reference``: all of it, or for a ``plain``
    model (which does not know where the middle ends) as many lines as ``reference`` has."""
    if family != PLAIN:
        return completion
    lines = completion.split("\n")
    return "\n".join(lines[: reference.count("\n") + 1])


def fim_case_scores(completions: list[str], cases: list[dict[str, Any]], family: str | None) -> list[CaseScore]:
    """Each completion against its case's middle, compared as far as ``comparable`` says."""
    middles = [case["middle"] for case in cases]
    texts = [comparable(completion, middle, family) for completion, middle in zip(completions, middles, strict=True)]
    return case_scores(texts, middles)


def fim_scores(completions: list[str], cases: list[dict[str, Any]], family: str | None) -> dict[str, float]:
    """Mean exact match (trailing whitespace aside) and edit similarity to the cases' middles."""
    return means(fim_case_scores(completions, cases, family))
