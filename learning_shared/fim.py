"""Fill-in-the-middle prompt formats of the base model families Strop serves.

Pure Python on purpose: the serving code imports this module, so it must never import torch.
vLLM does not support ``suffix`` for most models, so the platform builds the FIM prompt itself
and stops generation on the family's stop tokens.

A model without FIM tokens (SmolLM2, most chat and base LMs) is the ``plain`` family: it
completes from the prefix alone, the suffix is not shown to it, and only its EOS stops it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FimFormat:
    """How one model family spells a fill-in-the-middle request (prefix-suffix-middle order)."""

    family: str
    prefix_token: str
    suffix_token: str
    middle_token: str
    # The exact prompt: ``{prefix_token}`` etc. are already substituted; ``{prefix}`` and
    # ``{suffix}`` are filled per request. CodeLlama puts spaces around its markers. A template
    # without ``{suffix}`` does not show the suffix to the model.
    template: str
    # Besides the model's own EOS, which ends every completion (vLLM and the trainer stop on it).
    stop_tokens: tuple[str, ...]
    eos_token: str  # "" where it is the tokenizer's own, whatever that is

    @property
    def has_fim_tokens(self) -> bool:
        return bool(self.prefix_token)


FIM_FORMATS: dict[str, FimFormat] = {
    # Qwen2.5-Coder and Strop's starter model.
    "qwen": FimFormat(
        family="qwen",
        prefix_token="<|fim_prefix|>",
        suffix_token="<|fim_suffix|>",
        middle_token="<|fim_middle|>",
        template="<|fim_prefix|>{prefix}<|fim_suffix|>{suffix}<|fim_middle|>",
        stop_tokens=(
            "<|endoftext|>",
            "<|fim_prefix|>",
            "<|fim_suffix|>",
            "<|fim_middle|>",
            "<|fim_pad|>",
            "<|repo_name|>",
            "<|file_sep|>",
            "<|im_start|>",
            "<|im_end|>",
        ),
        eos_token="<|endoftext|>",
    ),
    "starcoder": FimFormat(
        family="starcoder",
        prefix_token="<fim_prefix>",
        suffix_token="<fim_suffix>",
        middle_token="<fim_middle>",
        template="<fim_prefix>{prefix}<fim_suffix>{suffix}<fim_middle>",
        stop_tokens=("<|endoftext|>", "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>"),
        eos_token="<|endoftext|>",
    ),
    "codellama": FimFormat(
        family="codellama",
        prefix_token="<PRE>",
        suffix_token="<SUF>",
        middle_token="<MID>",
        template="<PRE> {prefix} <SUF>{suffix} <MID>",
        stop_tokens=("<EOT>", "</s>", "<PRE>", "<SUF>", "<MID>"),
        eos_token="</s>",
    ),
    "deepseek": FimFormat(
        family="deepseek",
        prefix_token="<｜fim▁begin｜>",
        suffix_token="<｜fim▁hole｜>",
        middle_token="<｜fim▁end｜>",
        template="<｜fim▁begin｜>{prefix}<｜fim▁hole｜>{suffix}<｜fim▁end｜>",
        stop_tokens=(
            "<｜end▁of▁sentence｜>",
            "<|EOT|>",
            "<｜fim▁begin｜>",
            "<｜fim▁hole｜>",
            "<｜fim▁end｜>",
        ),
        eos_token="<｜end▁of▁sentence｜>",
    ),
    # Any tokenizer without FIM markers: the prompt is the prefix alone.
    "plain": FimFormat(
        family="plain",
        prefix_token="",
        suffix_token="",
        middle_token="",
        template="{prefix}",
        stop_tokens=(),
        eos_token="",
    ),
}

PLAIN = "plain"
FAMILIES: tuple[str, ...] = tuple(FIM_FORMATS)
FIM_FAMILIES: tuple[str, ...] = tuple(name for name, fmt in FIM_FORMATS.items() if fmt.has_fim_tokens)


def fim_format(family: str) -> FimFormat:
    """The format of ``family``; raises ``ValueError`` naming the known families."""
    try:
        return FIM_FORMATS[family]
    except KeyError:
        raise ValueError(f"unknown FIM family {family!r}; known: {', '.join(FAMILIES)}") from None


def build_fim_prompt(family: str, prefix: str, suffix: str) -> str:
    """The prompt that asks a ``family`` model for the middle between ``prefix`` and ``suffix``."""
    # str.replace, not str.format: code is full of braces.
    fmt = fim_format(family)
    head, _, rest = fmt.template.partition("{prefix}")
    middle, shows_suffix, tail = rest.partition("{suffix}")
    return f"{head}{prefix}{middle}{suffix if shows_suffix else ''}{tail}"


def stop_tokens(family: str) -> list[str]:
    """Strings that end a FIM completion for ``family`` besides the model's EOS (pass them as
    vLLM ``stop``); empty for ``plain``."""
    return list(fim_format(family).stop_tokens)


def _token_strings_of(model_dir: Path) -> set[str]:
    """Every vocabulary and added-token string a HF model directory declares (JSON only)."""
    tokens: set[str] = set()
    tokenizer_json = model_dir / "tokenizer.json"
    if tokenizer_json.is_file():
        data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
        tokens.update(t["content"] for t in data.get("added_tokens", []))
        vocab = data.get("model", {}).get("vocab", {})
        if isinstance(vocab, dict):
            tokens.update(vocab)
        elif isinstance(vocab, list):  # unigram models: [[piece, score], ...]
            tokens.update(piece for piece, _score in vocab)
    tokenizer_config = model_dir / "tokenizer_config.json"
    if tokenizer_config.is_file():
        data = json.loads(tokenizer_config.read_text(encoding="utf-8"))
        tokens.update(t["content"] for t in data.get("added_tokens_decoder", {}).values())
        tokens.update(data.get("additional_special_tokens") or [])
    return tokens


def detect_family(model_dir_or_vocab: str | Path | Mapping[str, int] | Iterable[str]) -> str:
    """The FIM family whose three marker tokens the tokenizer knows, else ``plain``.

    Accepts a HF model directory (reads tokenizer.json / tokenizer_config.json, no torch) or a
    vocabulary (a ``{token: id}`` mapping such as ``tokenizer.get_vocab()``, or token strings).
    """
    if isinstance(model_dir_or_vocab, (str, Path)):
        tokens = _token_strings_of(Path(model_dir_or_vocab))
    else:
        tokens = set(model_dir_or_vocab)
    for name in FIM_FAMILIES:
        fmt = FIM_FORMATS[name]
        markers = (fmt.prefix_token, fmt.suffix_token, fmt.middle_token)
        # SentencePiece vocabularies (CodeLlama) store the markers as "▁<PRE>".
        if all(m in tokens or f"▁{m}" in tokens for m in markers):
            return fmt.family
    return PLAIN
