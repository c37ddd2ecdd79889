"""The chat template of a base model: its own, or ChatML for a model that has none.

vLLM renders served conversations with it (``platform/vllm.sh`` passes ``--chat-template`` for a
model without one) and the dataset export renders logged ones with it, so both give the same ids.
Before a template sees them, messages are put in the shape vLLM hands a template: text content
(a list of text parts joined, or kept as parts for a template that loops over them; other parts
dropped; no content is empty), an assistant's ``tool_calls`` with their ``arguments`` parsed into
an object. A template then never meets a shape it cannot render (SmolLM2's concatenates
``content`` as a string and knows nothing of tool calls).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jinja2
import jinja2.nodes

DEFAULT_CHAT_TEMPLATE = Path(__file__).with_name("chat_template.jinja")


def has_own_chat_template(model_dir: str | Path) -> bool:
    """Whether the model directory carries a chat template (tokenizer_config.json or a .jinja file)."""
    model_dir = Path(model_dir)
    if (model_dir / "chat_template.jinja").is_file() or (model_dir / "chat_template.json").is_file():
        return True
    config = model_dir / "tokenizer_config.json"
    return config.is_file() and bool(json.loads(config.read_text(encoding="utf-8")).get("chat_template"))


def chat_prompt_text(tokenizer: Any, model_dir: str | Path, messages: list[dict[str, Any]], tools: Any = None) -> str:
    """``messages`` rendered for the next assistant reply, as vLLM renders them."""
    template = None if has_own_chat_template(model_dir) else DEFAULT_CHAT_TEMPLATE.read_text(encoding="utf-8")
    in_parts = reads_content_parts(template if template is not None else tokenizer.chat_template)
    text: str = tokenizer.apply_chat_template(
        as_template_reads(messages, content_parts=in_parts),
        tools=tools,
        chat_template=template,
        add_generation_prompt=True,
        tokenize=False,
    )
    return text


def chat_prompt_ids(
    tokenizer: Any, model_dir: str | Path, messages: list[dict[str, Any]], tools: Any = None
) -> list[int]:
    """The ids of ``messages`` rendered for the next assistant reply, as vLLM tokenizes them (no
    special tokens added: the template writes its own)."""
    return list(tokenizer.encode(chat_prompt_text(tokenizer, model_dir, messages, tools), add_special_tokens=False))


def chat_completion_text(content: str, tool_calls: Any) -> str:
    """An assistant reply as the model writes it: its text, then each tool call in the form Strop's
    template renders one (``<tool_call>{"name", "arguments"}</tool_call>``, which vLLM's ``hermes``
    parser reads back from a served answer). A reply that made tool calls is never empty text, so
    it is never the "stay silent" action."""
    calls = _tool_calls(tool_calls)
    written = (
        json.dumps({"name": call["function"]["name"], "arguments": call["function"]["arguments"]}, ensure_ascii=False)
        for call in calls
    )
    return content + "".join(f"\n<tool_call>\n{text}\n</tool_call>" for text in written)


def reads_content_parts(template: Any) -> bool:
    """Whether ``template`` loops over a message's ``content`` (then vLLM hands it text parts), or
    reads it as one string (then vLLM joins the parts with newlines). A template that cannot be
    parsed here (or several named ones) is taken to read a string, vLLM's default."""
    return isinstance(template, str) and _loops_over_content(template)


@functools.lru_cache(maxsize=32)
def _loops_over_content(template: str) -> bool:
    try:
        tree = jinja2.Environment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
    except jinja2.TemplateError:
        return False
    return any(_names_content(loop.iter) for loop in tree.find_all(jinja2.nodes.For))


def _names_content(node: jinja2.nodes.Node) -> bool:
    if isinstance(node, jinja2.nodes.Getitem):
        return isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == "content"
    if isinstance(node, jinja2.nodes.Getattr):
        return node.attr == "content"
    return isinstance(node, jinja2.nodes.Name) and node.name == "content"


def as_template_reads(messages: list[dict[str, Any]], *, content_parts: bool = False) -> list[dict[str, Any]]:
    """``messages`` in the shape vLLM hands a chat template (``content_parts``: the template loops
    over text parts). Raises ``ValueError`` for a message no template could be given."""
    out = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ValueError(f"messages[{index}] is not a message with a role")
        role = message["role"]
        try:
            texts = _texts(message.get("content"))
        except ValueError as exc:
            raise ValueError(f"messages[{index}].content {exc}") from None
        # A tool's answer is one string whatever the template reads, as vLLM gives it.
        as_parts = content_parts and role != "tool"
        content: Any = [{"type": "text", "text": text} for text in texts] if as_parts else "\n".join(texts)
        shaped: dict[str, Any] = {"role": role, "content": content}
        if isinstance(message.get("name"), str):
            shaped["name"] = message["name"]
        if role == "tool" and isinstance(message.get("tool_call_id"), str):
            shaped["tool_call_id"] = message["tool_call_id"]
        if role == "assistant":
            try:
                calls = _tool_calls(message.get("tool_calls"))
            except ValueError as exc:
                raise ValueError(f"messages[{index}].tool_calls {exc}") from None
            if calls:
                shaped["tool_calls"] = calls
        out.append(shaped)
    return out


def _texts(content: Any) -> list[str]:
    """A message's text: a string, the text parts of a list (others dropped), none for null."""
    if content is None:
        return []
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        raise ValueError(f"is a {type(content).__name__}, not text")
    return [
        part["text"]
        for part in content
        if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
    ]


def _tool_calls(calls: Any) -> list[dict[str, Any]]:
    """An assistant's tool calls as a template takes them: function calls, each one's ``arguments``
    an object (vLLM parses the JSON text; text that is not a JSON object becomes ``{}``, as there)."""
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise ValueError("is not a list of tool calls")
    shaped = []
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise ValueError(f'[{index}] is not {{"type": "function", "function": {{"name", "arguments"}}}}')
        shaped.append({**call, "type": "function", "function": {**function, "arguments": _arguments(function)}})
    return shaped


def _arguments(function: dict[str, Any]) -> dict[str, Any]:
    arguments = function.get("arguments")
    if isinstance(arguments, dict):
        return arguments
    if not arguments or not isinstance(arguments, str):
        return {}
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}
