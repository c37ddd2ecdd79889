"""Scoring a dataset with the base model or an adapter: the CLI's ``score``.

Two kinds of records, in one JSONL file or mixed:

- training samples (``prompt_token_ids`` + ``completion_token_ids``): mean log-prob of the
  completions under the model;
- FIM cases (``prefix``, ``suffix``, ``middle``): greedy-decode the middle from the family's FIM
  prompt (``decoding.greedy_completions``, batched as in the gate) and report exact match and
  edit similarity to the reference ``middle`` (``fim_metrics``).

peft is imported inside ``score_dataset``, only when an adapter is scored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from gpu_trainer.adapters import verify_adapter
from gpu_trainer.batching import make_batch, plan_micro_batches, sequence_length
from gpu_trainer.config import PPOConfig
from gpu_trainer.decoding import fim_scores, greedy_completions
from gpu_trainer.logprobs import completion_logprobs
from gpu_trainer.memory import release_freed_memory
from gpu_trainer.model_loading import load_base_model, load_tokenizer, special_token_ids
from gpu_trainer.precision import resolve_device_dtype
from learning_shared.errors import TrainerInputError
from learning_shared.fim import build_fim_prompt, detect_family
from learning_shared.samples import Sample, check_samples_against_vocab


def read_records(path: str | Path) -> list[dict[str, Any]]:
    records = []
    with open(path, encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, start=1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise TrainerInputError(f"line {line_no}: invalid JSON: {exc}") from None
    if not records:
        raise TrainerInputError(f"{path}: no records")
    return records


def score_dataset(records: list[dict[str, Any]], *, base_model_dir: str | Path, adapter_dir: str | Path | None = None,
                  family: str | None = None, max_new_tokens: int = 64, device: str = "auto",
                  max_tokens_per_pass: int = 1024) -> dict[str, Any]:
    """Mean completion log-prob (training samples) and exact match / edit similarity (FIM cases).

    ``records`` are read from a file (``load_records``): the one place here where samples cross a
    file boundary, so they are parsed with ``Sample.from_dict``.

    Every forward pass holds at most ``max_tokens_per_pass`` tokens (a FIM pass counts each
    prompt plus ``max_new_tokens``).
    """
    torch_device, dtype = resolve_device_dtype(PPOConfig(device=device))
    model = load_base_model(base_model_dir, torch_device, dtype)
    tokenizer = load_tokenizer(base_model_dir)
    if adapter_dir is not None:
        from peft import PeftModel

        verify_adapter(adapter_dir)
        model = PeftModel.from_pretrained(model, str(adapter_dir))
    model.eval()
    eos_id, pad_id = special_token_ids(tokenizer, model)
    family = family or detect_family(base_model_dir)

    samples = [Sample.from_dict(r, i) for i, r in enumerate(records) if "prompt_token_ids" in r]
    fim_cases = [r for r in records if "prefix" in r and "middle" in r]
    result: dict[str, Any] = {"adapter": str(adapter_dir) if adapter_dir else None, "family": family}
    if samples:
        check_samples_against_vocab(samples, model.get_input_embeddings().num_embeddings)
        max_prompt = 4096  # longer prompts are truncated from the left
        lengths = [sequence_length(s, eos_id=eos_id, max_prompt_tokens=max_prompt) for s in samples]
        total, tokens = 0.0, 0
        with torch.no_grad():
            for rows in plan_micro_batches(lengths, range(len(samples)), max_tokens=max_tokens_per_pass):
                batch = make_batch([samples[i] for i in rows], eos_id=eos_id, pad_id=pad_id,
                                   max_prompt_tokens=max_prompt, device=torch_device)
                logprobs, _ = completion_logprobs(model, batch)
                total += float(logprobs.sum())
                tokens += int(batch.mask.sum())
                release_freed_memory()
        result.update(samples=len(samples), completion_tokens=tokens, mean_logprob=total / tokens)
    if fim_cases:
        prompts = [build_fim_prompt(family, case["prefix"], case.get("suffix") or "") for case in fim_cases]
        middles = greedy_completions(model, tokenizer, prompts, family=family, eos_id=eos_id, pad_id=pad_id,
                                     max_new_tokens=max_new_tokens, max_tokens_per_pass=max_tokens_per_pass,
                                     device=torch_device)
        result.update(fim_cases=len(fim_cases), **fim_scores(middles, fim_cases, family))
    if not samples and not fim_cases:
        raise TrainerInputError("no record has prompt_token_ids or prefix/middle fields")
    return result
