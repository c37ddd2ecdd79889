"""Shared helpers of the trainer tests: probabilities under a base model with or without an adapter."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from learning_shared.samples import Sample

FIM_PROMPT_TEXT = "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n\nprint(add(1, 2))\n<|fim_middle|>"
# FIM cases whose middles a test fills in (with the base model's own greedy middles, say).
FIM_CASES = [
    {"prefix": "def add(a, b):\n    ", "suffix": "\n\nprint(add(1, 2))\n", "middle": ""},
    {"prefix": "import os\n\ndef read(path):\n    with open(path) as fh:\n        ", "suffix": "\n    return data\n",
     "middle": ""},
    {"prefix": "class Stack:\n    def __init__(self):\n        ", "suffix": "\n\n    def push(self, x):\n",
     "middle": ""},
    {"prefix": "for i in range(10):\n    ", "suffix": "\n", "middle": ""},
]


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


def without_fim_tokens(model_dir: Path, to: Path) -> Path:
    """A copy of ``model_dir`` whose tokenizer no longer declares FIM markers: a ``plain`` model
    with the same weights (the marker ids simply never come up)."""
    import json
    import shutil

    shutil.copytree(model_dir, to)
    (to / "strop_base.json").unlink(missing_ok=True)
    tokenizer = json.loads((to / "tokenizer.json").read_text())
    tokenizer["added_tokens"] = [t for t in tokenizer["added_tokens"] if "fim" not in t["content"]]
    tokenizer["model"]["vocab"] = {k: v for k, v in tokenizer["model"]["vocab"].items() if "fim" not in k}
    (to / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = json.loads((to / "tokenizer_config.json").read_text())
    config.pop("additional_special_tokens", None)
    config["added_tokens_decoder"] = {
        k: v for k, v in config.get("added_tokens_decoder", {}).items() if "fim" not in v["content"]
    }
    (to / "tokenizer_config.json").write_text(json.dumps(config))
    return to


def completion_logprobs(model, prompt_ids: list[int], completion_ids: list[int]) -> list[float]:
    """log π(token | prompt, the tokens before it) of each completion token (teacher-forced)."""
    ids = torch.tensor([prompt_ids + completion_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float()
    chosen = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(completion_ids).unsqueeze(-1))
    return chosen.squeeze(-1).tolist()


def typed(samples: list[dict]) -> list[Sample]:
    """The tests write samples as dicts for brevity; the trainer takes them typed, as the
    exporter builds them (``Sample.build``)."""
    return [Sample.build(**sample) for sample in samples]


def with_base_middles(model_dir: Path, cases: list[dict], *, max_new_tokens: int = 8) -> list[dict]:
    """``cases`` (qwen FIM prefix/suffix) with each middle set to the base model's own greedy one:
    the base model gets every case right."""
    from gpu_trainer.decoding import greedy_completions
    from gpu_trainer.model_loading import load_tokenizer, special_token_ids
    from learning_shared.fim import build_fim_prompt

    tokenizer = load_tokenizer(model_dir)
    model = load(model_dir)
    eos_id, pad_id = special_token_ids(tokenizer, model)
    prompts = [build_fim_prompt("qwen", case["prefix"], case["suffix"]) for case in cases]
    middles = greedy_completions(model, tokenizer, prompts, family="qwen", eos_id=eos_id, pad_id=pad_id,
                                 max_new_tokens=max_new_tokens, max_tokens_per_pass=2048, device="cpu")
    return [{**case, "middle": middle} for case, middle in zip(cases, middles, strict=True)]
