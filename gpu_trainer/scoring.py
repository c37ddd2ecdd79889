"""Scoring a dataset with the base model or an adapter (the CLI's ``score``, GRPO's reward).

Two kinds of records, in one JSONL file or mixed:

- training samples (``prompt_token_ids`` + ``completion_token_ids``): mean log-prob of the
  completions under the model;
- FIM cases (``prefix``, ``suffix``, ``middle``): greedy-decode the middle from the family's FIM
  prompt and report exact match and edit similarity to the reference ``middle``.

Torch is imported inside the functions: ``edit_similarity`` is cheap to import.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpu_trainer.errors import TrainerInputError


def edit_similarity(candidate: str, reference: str) -> float:
    """1 − Levenshtein distance / length of the longer string (1.0 for two empty strings)."""
    if candidate == reference:
        return 1.0
    if len(candidate) < len(reference):
        candidate, reference = reference, candidate
    previous = list(range(len(reference) + 1))
    for i, c in enumerate(candidate, start=1):
        current = [i]
        for j, r in enumerate(reference, start=1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (c != r)))
        previous = current
    return 1.0 - previous[-1] / max(len(candidate), 1)


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


def stop_token_ids(tokenizer, family: str | None, eos_id: int) -> list[int]:
    """EOS plus the family's stop tokens that are single tokens of this tokenizer."""
    from gpu_trainer.fim import stop_tokens

    ids = {eos_id}
    if family is not None:
        vocab = tokenizer.get_vocab()
        ids.update(vocab[t] for t in stop_tokens(family) if t in vocab)
    return sorted(ids)


def cut_at_stop(text: str, family: str | None) -> str:
    from gpu_trainer.fim import stop_tokens

    for stop in stop_tokens(family) if family else []:
        text = text.split(stop, 1)[0]
    return text


def greedy_middle(model, tokenizer, prompt: str, *, family: str | None, eos_id: int, pad_id: int,
                  max_new_tokens: int, device) -> str:
    """The model's greedy completion of a FIM prompt, cut at the first stop token."""
    import torch

    input_ids = torch.tensor([tokenizer.encode(prompt, add_special_tokens=False)], device=device)
    with torch.no_grad():
        output = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=stop_token_ids(tokenizer, family, eos_id),
            pad_token_id=pad_id,
        )
    text = tokenizer.decode(output[0, input_ids.shape[1]:].tolist(), skip_special_tokens=False)
    return cut_at_stop(text, family)


def score_dataset(records: list[dict[str, Any]], *, base_model_dir: str | Path, adapter_dir: str | Path | None = None,
                  family: str | None = None, max_new_tokens: int = 64, device: str = "auto") -> dict[str, Any]:
    """Mean completion log-prob (training samples) and exact match / edit similarity (FIM cases)."""
    import torch

    from gpu_trainer.config import PPOConfig
    from gpu_trainer.fim import build_fim_prompt, detect_family
    from gpu_trainer.policy import (
        completion_logprobs,
        load_base_model,
        load_tokenizer,
        make_batch,
        resolve_device_dtype,
        special_token_ids,
    )
    from gpu_trainer.samples import Sample, check_samples_against_vocab

    torch_device, dtype = resolve_device_dtype(PPOConfig(device=device))
    model = load_base_model(base_model_dir, torch_device, dtype)
    tokenizer = load_tokenizer(base_model_dir)
    if adapter_dir is not None:
        from peft import PeftModel

        from gpu_trainer.adapters import verify_adapter

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
        total, tokens = 0.0, 0
        with torch.no_grad():
            for start in range(0, len(samples), 16):
                batch = make_batch(samples[start:start + 16], eos_id=eos_id, pad_id=pad_id,
                                   max_prompt_tokens=4096, device=torch_device)
                logprobs, _ = completion_logprobs(model, batch)
                total += float(logprobs.sum())
                tokens += int(batch.mask.sum())
        result.update(samples=len(samples), completion_tokens=tokens, mean_logprob=total / tokens)
    if fim_cases:
        if family is None:
            raise TrainerInputError(f"base model {base_model_dir}: no known FIM tokens; pass family")
        exact, similarity = 0, 0.0
        for case in fim_cases:
            prompt = build_fim_prompt(family, case["prefix"], case.get("suffix", ""))
            middle = greedy_middle(model, tokenizer, prompt, family=family, eos_id=eos_id, pad_id=pad_id,
                                   max_new_tokens=max_new_tokens, device=torch_device)
            exact += middle.rstrip() == case["middle"].rstrip()
            similarity += edit_similarity(middle, case["middle"])
        result.update(fim_cases=len(fim_cases), exact_match=exact / len(fim_cases),
                      edit_similarity=similarity / len(fim_cases))
    if not samples and not fim_cases:
        raise TrainerInputError("no record has prompt_token_ids or prefix/middle fields")
    return result
