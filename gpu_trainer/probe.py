"""The serve probe: per-token log-probs of one fixed token sequence under an adapter.

Recorded beside a version when it is made; before the version takes traffic, vLLM is asked for
the same log-probs and must match within a tolerance. That catches the class of bugs where the
trained weights silently never reach serving (a wrong directory, a stale cache, a base mismatch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

PROBE_PROMPT_TOKENS = 48
PROBE_COMPLETION_TOKENS = 16


def probe_tokens(prompt_token_ids: list[int], completion_token_ids: list[int], *, eos_id: int) -> dict[str, list[int]]:
    """A probe cut from a real sample: the end of its prompt and the start of its completion."""
    completion = list(completion_token_ids[:PROBE_COMPLETION_TOKENS]) or [eos_id]
    return {"prompt_token_ids": list(prompt_token_ids[-PROBE_PROMPT_TOKENS:]), "completion_token_ids": completion}


def probe_logprobs(*, base_model_dir: str | Path, adapter_dir: str | Path, prompt_token_ids: list[int],
                   completion_token_ids: list[int], device: str = "cpu") -> list[float]:
    """Log-prob of each completion token given what precedes it, under base + adapter, in fp32."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base_model_dir), dtype=torch.float32).to(device)
    model = PeftModel.from_pretrained(model, str(adapter_dir)).eval()
    ids = torch.tensor([list(prompt_token_ids) + list(completion_token_ids)], device=device)
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, len(prompt_token_ids) - 1 : -1].float()
    targets = torch.tensor(completion_token_ids, device=device)
    chosen = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return [float(x) for x in chosen.cpu()]


def serve_probe(*, base_model_dir: str | Path, adapter_dir: str | Path, prompt_token_ids: list[int],
                completion_token_ids: list[int]) -> dict[str, Any]:
    """The record stored with a version: the tokens and the trainer's log-probs of them."""
    logprobs = probe_logprobs(base_model_dir=base_model_dir, adapter_dir=adapter_dir,
                              prompt_token_ids=prompt_token_ids, completion_token_ids=completion_token_ids)
    return {"prompt_token_ids": list(prompt_token_ids), "completion_token_ids": list(completion_token_ids),
            "logprobs": logprobs}
