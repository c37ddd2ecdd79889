"""Expected outcomes of the ``line`` developer, computed instead of sampled (the learning benchmark's
low-noise figures).

A ``line`` developer accepts a suggestion only when it is the rest of the line, so under a policy
π the probability that a request is accepted is the probability of sampling the rest of the line
and then ending: P(accept) = π(rest tokens | prompt) × π(end | prompt, rest), where "end" is EOS
or, when the client stops at a line break, any token that starts a new line. The request is
silent (nothing shown) when the first token already ends the suggestion. One teacher-forced
forward pass per task gives both, for every task and every model, with no sampling noise; the
same tasks under two models give a paired comparison. The rest of the line is scored in its own
tokenization only (a sampled suggestion could spell it in other tokens too, which this leaves
out), so these are close lower bounds of the sampled rates, not the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.simdev import Estimate, Task, mean_interval


@dataclass(frozen=True)
class Expected:
    """Per task: P(accepted) and P(silent) under one model."""

    accept: list[float]
    silent: list[float]

    def figures(self) -> dict[str, float]:
        accepted = sum(self.accept) / len(self.accept)
        shown = 1.0 - sum(self.silent) / len(self.silent)
        return {
            "accept_rate": accepted / shown if shown > 0 else math.nan,
            "shown_per_request": shown,
            "accepted_per_request": accepted,
            "mean_reward": 0.75 * accepted - 0.25 * (shown - accepted),
        }


def ending_token_ids(tokenizer, *, line_stop: bool) -> list[int]:
    """EOS, and with a line-break stop every token whose text starts a new line (blanks first allowed).
    Read once per tokenizer: the line-break scan decodes the whole vocabulary, and every evaluated
    model of a run shares its tokenizer."""
    key = (tokenizer.name_or_path, len(tokenizer), int(tokenizer.eos_token_id), line_stop)
    if key not in _ENDING_IDS:
        ids = {int(tokenizer.eos_token_id)}
        if line_stop:
            for token_id in range(len(tokenizer)):
                if tokenizer.decode([token_id]).lstrip(" \t").startswith(("\n", "\r")):
                    ids.add(token_id)
        _ENDING_IDS[key] = sorted(ids)
    return _ENDING_IDS[key]


_ENDING_IDS: dict[tuple[str, int, int, bool], list[int]] = {}


def expected_outcomes(model, tokenizer, prompts: Sequence[str], tasks: Sequence[Task], *, line_stop: bool,
                      pass_tokens: int) -> Expected:
    """P(accepted) and P(silent) of every task under ``model`` (teacher forced, batched by tokens)."""
    import torch

    from gpu_trainer.batching import make_batch, plan_micro_batches
    from gpu_trainer.logprobs import completion_logits
    from gpu_trainer.memory import release_freed_memory
    from gpu_trainer.model_loading import special_token_ids
    from learning_shared.samples import Sample

    eos_id, pad_id = special_token_ids(tokenizer, model)
    ending = torch.tensor(ending_token_ids(tokenizer, line_stop=line_stop), device=model.device)
    samples = []
    for prompt, task in zip(prompts, tasks, strict=True):
        rest = tokenizer.encode(task.line_rest.rstrip(), add_special_tokens=False)
        # EOS stands in for "the token after the rest": only the distribution there is read.
        samples.append(Sample(id=task.id, prompt_token_ids=tokenizer.encode(prompt, add_special_tokens=False),
                              completion_token_ids=[*rest, eos_id], behaviour_logprobs=None, reward=0.0))
    lengths = [len(s.prompt_token_ids) + len(s.completion_token_ids) for s in samples]
    accept, silent = [0.0] * len(samples), [0.0] * len(samples)
    with torch.inference_mode():
        for rows in plan_micro_batches(lengths, range(len(samples)), max_tokens=pass_tokens):
            batch = make_batch([samples[i] for i in rows], eos_id=eos_id, pad_id=pad_id,
                               max_prompt_tokens=max(lengths), device=model.device)
            logprobs = torch.log_softmax(completion_logits(model, batch), dim=-1)  # [B, W, V]
            for row, index in enumerate(rows):
                size = len(samples[index].completion_token_ids)  # rest + the end slot
                positions = logprobs[row, batch.width - size:]
                rest = batch.targets[row, batch.width - size: batch.width - 1]
                typed = positions[:-1].gather(-1, rest.unsqueeze(-1)).sum()
                end = torch.logsumexp(positions[-1, ending], dim=0)
                accept[index] = float((typed + end).exp()) if size > 1 else 0.0  # nothing to type
                silent[index] = float(torch.logsumexp(positions[0, ending], dim=0).exp())
            del logprobs
            release_freed_memory()
    return Expected(accept, silent)


def paired_difference(new: Sequence[float], old: Sequence[float]) -> Estimate:
    """The mean per-task difference with its 95 % interval (the same tasks under two models)."""
    return mean_interval([a - b for a, b in zip(new, old, strict=True)])
