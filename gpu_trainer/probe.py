"""The serve probe: per-token log-probs of one fixed token sequence under an adapter.

Recorded beside a version when it is made; before the version takes traffic, vLLM is asked for
the same log-probs and must match within a tolerance. That catches the class of bugs where the
trained weights silently never reach serving (a wrong directory, a stale cache, a base mismatch).

The sequence is synthetic (``PROBE_TEXT``, tokenized with the base model's tokenizer), never cut
from a training sample: what a version keeps must hold nothing derived from an end user's text,
or decoding it would give an erased user's code back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Code any base model reads, written for the probe: its prompt is all but the last
# PROBE_COMPLETION_TOKENS tokens, the completion whose log-probs are compared is those.
PROBE_TEXT = 'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n    if n < 2:\n        return n\n'
PROBE_COMPLETION_TOKENS = 8
# What a record made from PROBE_TEXT says it is (``source``); any other record is refused.
PROBE_SOURCE = "synthetic"


def probe_tokens(tokenizer: Any) -> dict[str, list[int]]:
    """The probe sequence in ``tokenizer``'s ids (a Hugging Face tokenizer of the base model)."""
    ids = [int(i) for i in tokenizer.encode(PROBE_TEXT, add_special_tokens=False)]
    cut = max(1, len(ids) - PROBE_COMPLETION_TOKENS)
    return {"prompt_token_ids": ids[:cut], "completion_token_ids": ids[cut:]}


def probe_logprobs(*, base_model_dir: str | Path, adapter_dir: str | Path, prompt_token_ids: list[int],
                   completion_token_ids: list[int], device: str = "cpu") -> list[float]:
    """Log-prob of each completion token given what precedes it, under base + adapter, in fp32."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(base_model_dir), dtype=torch.float32)
    base.to(device)  # type: ignore[arg-type]  # transformers' stub of .to() takes a model
    model = PeftModel.from_pretrained(base, str(adapter_dir)).eval()
    ids = torch.tensor([list(prompt_token_ids) + list(completion_token_ids)], device=device)
    with torch.inference_mode():
        logits = model(input_ids=ids).logits[0, len(prompt_token_ids) - 1 : -1].float()
    targets = torch.tensor(completion_token_ids, device=device)
    chosen = logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return [float(x) for x in chosen.cpu()]


def serve_probe(*, base_model_dir: str | Path, adapter_dir: str | Path) -> dict[str, Any]:
    """The record stored with a version: the synthetic probe's tokens (in the base model's ids) and
    the trainer's log-probs of them under base + adapter."""
    from transformers import AutoTokenizer

    tokens = probe_tokens(AutoTokenizer.from_pretrained(str(base_model_dir)))
    logprobs = probe_logprobs(
        base_model_dir=base_model_dir,
        adapter_dir=adapter_dir,
        prompt_token_ids=tokens["prompt_token_ids"],
        completion_token_ids=tokens["completion_token_ids"],
    )
    return {"source": PROBE_SOURCE, **tokens, "logprobs": logprobs}
