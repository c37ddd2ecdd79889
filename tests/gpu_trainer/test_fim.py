"""FIM prompt formats: pure Python, importable by serving without torch."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from learning_shared.fim import FAMILIES, FIM_FAMILIES, build_fim_prompt, detect_family, stop_tokens


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        ("qwen", "<|fim_prefix|>def f(x):\n    <|fim_suffix|>\n{y}<|fim_middle|>"),
        ("starcoder", "<fim_prefix>def f(x):\n    <fim_suffix>\n{y}<fim_middle>"),
        ("codellama", "<PRE> def f(x):\n     <SUF>\n{y} <MID>"),
        ("deepseek", "<｜fim▁begin｜>def f(x):\n    <｜fim▁hole｜>\n{y}<｜fim▁end｜>"),
    ],
)
def test_build_fim_prompt_puts_prefix_then_suffix_then_the_middle_marker(family, expected):
    # Braces in code must survive: the template is not a str.format string.
    assert build_fim_prompt(family, "def f(x):\n    ", "\n{y}") == expected


def test_plain_family_prompts_with_the_prefix_alone_and_stops_on_eos_only():
    assert "plain" in FAMILIES and "plain" not in FIM_FAMILIES
    assert build_fim_prompt("plain", "def f(x):\n    ", "\n{y}") == "def f(x):\n    "
    assert stop_tokens("plain") == []


def test_stop_tokens_include_eos_and_fim_markers():
    for family in FIM_FAMILIES:
        stops = stop_tokens(family)
        assert stops and len(set(stops)) == len(stops)
    assert "<|endoftext|>" in stop_tokens("qwen") and "<|fim_prefix|>" in stop_tokens("qwen")
    assert "<EOT>" in stop_tokens("codellama")


def test_unknown_family_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown FIM family 'gpt2'"):
        build_fim_prompt("gpt2", "a", "b")


def test_detect_family_from_vocab_and_from_a_model_directory(tmp_path):
    assert detect_family({"<|fim_prefix|>": 1, "<|fim_suffix|>": 2, "<|fim_middle|>": 3}) == "qwen"
    assert detect_family(["<fim_prefix>", "<fim_suffix>", "<fim_middle>"]) == "starcoder"
    assert detect_family(["▁<PRE>", "▁<SUF>", "▁<MID>"]) == "codellama"
    assert detect_family(["hello", "<|fim_prefix|>"]) == "plain"  # one marker is not a format
    tokenizer = {"added_tokens": [{"content": t} for t in ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>")],
                 "model": {"vocab": {"a": 0}}}
    (tmp_path / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert detect_family(tmp_path) == "deepseek"


def test_importing_fim_does_not_import_torch():
    code = "import sys, learning_shared.fim, gpu_trainer.config, learning_shared.samples; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
