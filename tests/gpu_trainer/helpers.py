"""Shared helpers of the trainer tests: probabilities under a base model with or without an adapter."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

FIM_PROMPT_TEXT = "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n\nprint(add(1, 2))\n<|fim_middle|>"


def load(base: Path, adapter: Path | None = None):
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
    return model.eval()


def next_token_probs(model, prompt_ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt_ids])).logits[0, -1]
    return torch.softmax(logits.float(), dim=-1)


def prompt_ids(base: Path) -> list[int]:
    return AutoTokenizer.from_pretrained(str(base)).encode(FIM_PROMPT_TEXT)
