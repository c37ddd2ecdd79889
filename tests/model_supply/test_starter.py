"""The starter model: built once per recipe, atomic, and an ordinary HF directory."""

from __future__ import annotations

import json
import time

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from learning_shared.fim import build_fim_prompt, detect_family
from model_supply import starter


def test_tiny_starter_is_cached(tiny_starter_model):
    started = time.monotonic()
    again = starter.ensure_starter_model("tiny")
    assert again == tiny_starter_model
    assert time.monotonic() - started < 1.0
    assert tiny_starter_model.name == f"starter-tiny-{starter.starter_recipe('tiny').digest()}"


def test_tiny_starter_loads_with_auto_classes_and_has_single_fim_tokens(tiny_starter_model):
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_starter_model))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_starter_model))
    assert type(model).__name__ == "Qwen2ForCausalLM"
    config = model.config
    assert config.vocab_size % 64 == 0 and config.vocab_size >= len(tokenizer)
    assert config.hidden_size // config.num_attention_heads == 64 and config.head_dim == 64
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.pad_token == "<|fim_pad|>"
    for token in ("<|endoftext|>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>"):
        assert len(tokenizer.encode(token, add_special_tokens=False)) == 1, token
    assert detect_family(tiny_starter_model) == "qwen"
    ids = tokenizer.encode(build_fim_prompt("qwen", "x = ", "\n"), add_special_tokens=False)
    assert ids[0] == tokenizer.convert_tokens_to_ids("<|fim_prefix|>")
    assert tokenizer.decode(tokenizer.encode("def f(a):\n    return a  # é")) == "def f(a):\n    return a  # é"
    # vLLM's own (possibly older) transformers must know the tokenizer class.
    assert json.loads((tiny_starter_model / "tokenizer_config.json").read_text())["tokenizer_class"] == (
        "PreTrainedTokenizerFast"
    )


def test_recipe_change_changes_the_directory():
    tiny = starter.starter_recipe("tiny")
    assert tiny.digest() == starter.starter_recipe("tiny").digest()
    assert tiny.digest() != starter.starter_recipe("small").digest()
    from dataclasses import replace

    assert replace(tiny, steps=tiny.steps + 1).digest() != tiny.digest()


def test_crashed_build_leaves_no_model_behind(tmp_path, monkeypatch):
    def crash(recipe, out_dir, progress=False):
        (out_dir / "config.json").write_text("{}")  # half a model
        raise RuntimeError("killed mid-build")

    monkeypatch.setattr(starter, "build_starter_model", crash)
    with pytest.raises(RuntimeError, match="killed mid-build"):
        starter.ensure_starter_model("tiny", tmp_path)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []
