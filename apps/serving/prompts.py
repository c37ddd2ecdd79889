"""Fill-in-the-middle prompts that clients build themselves, recognised and rebuilt for our base.

Editor plugins that talk to "an OpenAI-compatible server" send the whole FIM prompt as ``prompt``,
spelled in the convention they guess from the model name (Continue falls back to StarCoder's
``<fim_prefix>…<fim_suffix>…<fim_middle>`` for names it does not know). Fed verbatim to another
model those markers are plain text it was never trained on. Strop recognises the common
conventions, keeps the prefix and suffix, and builds the base model's own prompt from them.

Pure Python: the serving path imports it, so no torch here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FimConvention:
    """One way clients spell a FIM request: marker strings in prefix-suffix-middle order, or
    suffix-prefix (``spm``) where the prompt ends with the prefix and has no middle marker."""

    name: str
    prefix_marker: str
    suffix_marker: str
    middle_marker: str  # "" for spm conventions, whose prompt ends with the prefix
    spm: bool = False


# The conventions of the model families editor plugins know (Continue's templates among them).
# Order matters only where one convention's markers contain another's: none do.
CONVENTIONS: tuple[FimConvention, ...] = (
    FimConvention("qwen", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # also CodeGemma, Granite 4
    FimConvention("starcoder", "<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StableCode, unknown names
    FimConvention("codellama", "<PRE> ", " <SUF>", " <MID>"),
    FimConvention("deepseek", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
    FimConvention("seed-coder", "<[fim-prefix]>", "<[fim-suffix]>", "<[fim-middle]>"),
    FimConvention("codestral", "[PREFIX]", "[SUFFIX]", "", spm=True),
)


@dataclass(frozen=True)
class ClientFimPrompt:
    """A FIM prompt a client built: what it asked to fill, and what Strop drops from it."""

    convention: str
    prefix: str
    suffix: str
    context_dropped: int  # characters before the first marker (other files' snippets, repo names)


def _once(text: str, marker: str) -> int:
    """Index of ``marker`` when it occurs exactly once in ``text``, else -1."""
    first = text.find(marker)
    if first < 0 or text.find(marker, first + 1) >= 0:
        return -1
    return first


def parse_fim_prompt(prompt: str) -> ClientFimPrompt | None:
    """The prefix and suffix of a client-built FIM prompt, or None when ``prompt`` is plain text.

    A prompt is recognised only when each marker of one convention occurs exactly once, in that
    convention's order, with the prompt ending on the middle marker (on the prefix for SPM):
    code that merely mentions a marker is left alone.
    """
    for convention in CONVENTIONS:
        p, s = _once(prompt, convention.prefix_marker), _once(prompt, convention.suffix_marker)
        if p < 0 or s < 0:
            continue
        if convention.spm:
            if s < p:  # [SUFFIX]S[PREFIX]P
                suffix = prompt[s + len(convention.suffix_marker) : p]
                prefix = prompt[p + len(convention.prefix_marker) :]
                return ClientFimPrompt(convention.name, prefix, suffix, s)
            continue
        if not prompt.endswith(convention.middle_marker) or _once(prompt, convention.middle_marker) < 0 or p > s:
            continue
        prefix = prompt[p + len(convention.prefix_marker) : s]
        suffix = prompt[s + len(convention.suffix_marker) : len(prompt) - len(convention.middle_marker)]
        return ClientFimPrompt(convention.name, prefix, suffix, p)
    return None
