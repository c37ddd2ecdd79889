"""The chat template of a base model: its own, or ChatML for a model that has none.

vLLM renders served conversations with it (``platform/vllm.sh`` passes ``--chat-template`` for a
model without one) and the dataset export renders logged ones with it, so both give the same ids.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DEFAULT_CHAT_TEMPLATE = Path(__file__).with_name("chat_template.jinja")


def has_own_chat_template(model_dir: str | Path) -> bool:
    """Whether the model directory carries a chat template (tokenizer_config.json or a .jinja file)."""
    model_dir = Path(model_dir)
    if (model_dir / "chat_template.jinja").is_file() or (model_dir / "chat_template.json").is_file():
        return True
    config = model_dir / "tokenizer_config.json"
    return config.is_file() and bool(json.loads(config.read_text(encoding="utf-8")).get("chat_template"))


def chat_prompt_text(
    tokenizer: Any, model_dir: str | Path, messages: list[dict[str, Any]], tools: Any = None
) -> str:
    """``messages`` rendered for the next assistant reply, as vLLM renders them."""
    template = None if has_own_chat_template(model_dir) else DEFAULT_CHAT_TEMPLATE.read_text(encoding="utf-8")
    text: str = tokenizer.apply_chat_template(
        _as_vllm_renders(messages), tools=tools, chat_template=template, add_generation_prompt=True, tokenize=False
    )
    return text


def chat_prompt_ids(
    tokenizer: Any, model_dir: str | Path, messages: list[dict[str, Any]], tools: Any = None
) -> list[int]:
    """The ids of ``messages`` rendered for the next assistant reply, as vLLM tokenizes them (no
    special tokens added: the template writes its own)."""
    return list(tokenizer.encode(chat_prompt_text(tokenizer, model_dir, messages, tools), add_special_tokens=False))


def _as_vllm_renders(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM hands a template each tool call's ``arguments`` parsed from its JSON text; so does this."""
    out = []
    for message in messages:
        calls = message.get("tool_calls")
        if calls:
            parsed = []
            for call in calls:
                function = dict(call.get("function") or {})
                try:
                    function["arguments"] = json.loads(function.get("arguments") or "{}")
                except (TypeError, ValueError):
                    pass
                parsed.append({**call, "function": function})
            message = {**message, "tool_calls": parsed}
        out.append(message)
    return out
