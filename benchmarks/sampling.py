"""Sampling suggestions from a policy with transformers, as serving samples them (the learning
benchmark's collection and evaluation): one completion per prompt, the sampled tokens' raw
log-probs, and a client's stop strings applied the way vLLM applies them."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Served:
    """One sampled suggestion: what serving would have returned and logged."""

    prompt_token_ids: list[int]
    completion_token_ids: list[int]  # EOS included when the model stopped on it
    logprobs: list[float]
    text: str
    finish_reason: str  # "stop" (EOS) or "length"




def sample_suggestions(
    model,
    tokenizer,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    temperature: float,
    seed: int,
    pass_tokens: int,
    progress: str | None,
    stop: Sequence[str] = (),
) -> list[Served]:
    """Sample one completion per prompt as serving does, with the sampled tokens' log-probs.

    Generation ends at EOS, at ``max_new_tokens``, or at the first ``stop`` string: then, as
    vLLM does, the text ends before the stop string and the token ids end with the token that
    completed it. Prompts are batched by length (``plan_micro_batches``); pass k is seeded with
    ``seed + k``, so the same prompts and seed give the same samples for the same model.
    """
    import torch
    from tqdm import tqdm

    from gpu_trainer.batching import plan_micro_batches
    from gpu_trainer.decoding import left_padded
    from gpu_trainer.memory import release_freed_memory
    from gpu_trainer.model_loading import special_token_ids

    eos_id, pad_id = special_token_ids(tokenizer, model)
    encoded = [tokenizer.encode(p, add_special_tokens=False) for p in prompts]
    lengths = [len(ids) + max_new_tokens for ids in encoded]
    served: list[Served | None] = [None] * len(prompts)
    passes = plan_micro_batches(lengths, range(len(prompts)), max_tokens=pass_tokens)
    bar = tqdm(total=len(prompts), desc=progress, unit="task", disable=progress is None, file=sys.stderr,
               mininterval=5)
    with bar:
        for number, rows in enumerate(passes):
            input_ids, attention_mask = (t.to(model.device) for t in left_padded([encoded[i] for i in rows], pad_id))
            length = input_ids.shape[1]
            torch.manual_seed(seed + number)
            with torch.inference_mode():
                output = model.generate(
                    input_ids=input_ids,
                    attention_mask=attention_mask,
                    max_new_tokens=max_new_tokens,
                    do_sample=True,
                    temperature=temperature,
                    top_p=1.0,
                    top_k=0,
                    eos_token_id=eos_id,
                    pad_token_id=pad_id,
                    **({"stop_strings": list(stop), "tokenizer": tokenizer} if stop else {}),
                    return_dict_in_generate=True,
                    output_logits=True,
                )
            generated = output.sequences[:, length:]
            # Raw log-probs of the sampled tokens (vLLM's default: before temperature).
            logprobs = torch.stack([torch.log_softmax(step.float(), dim=-1) for step in output.logits], dim=1)
            chosen = logprobs.gather(-1, generated.unsqueeze(-1)).squeeze(-1)
            for row, index in enumerate(rows):
                tokens, text, stopped = cut_completion(tokenizer, generated[row].tolist(), eos_id, stop)
                served[index] = Served(
                    prompt_token_ids=encoded[index],
                    completion_token_ids=tokens,
                    logprobs=[float(x) for x in chosen[row, : len(tokens)].tolist()],
                    text=text,
                    finish_reason="stop" if stopped else "length",
                )
            bar.update(len(rows))
            del output, logprobs
            release_freed_memory()
    return [s for s in served if s is not None]


def cut_completion(tokenizer, tokens: list[int], eos_id: int, stop: Sequence[str]) -> tuple[list[int], str, bool]:
    """(token ids kept, text, stopped): up to and including EOS or the token completing a stop
    string; the text holds neither."""
    end = next((i for i, t in enumerate(tokens) if t == eos_id), None)
    body = tokens if end is None else tokens[:end]
    if stop:
        for i in range(len(body)):
            text = tokenizer.decode(body[: i + 1], skip_special_tokens=True)
            hits = [text.find(s) for s in stop if s in text]
            if hits:
                return body[: i + 1], text[: min(hits)], True
    text = tokenizer.decode(body, skip_special_tokens=True)
    return (body if end is None else body + [eos_id]), text, end is not None


