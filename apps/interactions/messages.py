"""Conversations in OpenAI's chat shape: what Strop accepts as ``messages`` and ``tools``.

The same checks serve the chat completion endpoint and the logging of agents served elsewhere,
so a conversation that one accepts the other accepts too. Errors name the field and the index.
"""

from __future__ import annotations

from typing import Any

from apps.common.parsing import json_problem

ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
MAX_MESSAGES = 1000


class MessageError(Exception):
    def __init__(self, field_name: str, message: str, code: str = "invalid") -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message
        self.code = code


def _content(message: dict[str, Any], where: str) -> None:
    content = message.get("content")
    if content is None:
        if message["role"] == "assistant" and message.get("tool_calls"):
            return
        raise MessageError(f"{where}.content", "is required (a string, or a list of text parts)", "required")
    if isinstance(content, str):
        return
    if not isinstance(content, list) or not content:
        raise MessageError(f"{where}.content", "must be a string or a non-empty list of text parts")
    for index, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise MessageError(
                f"{where}.content[{index}]",
                'must be a text part {"type": "text", "text": "..."}; this base model reads text only',
            )


def _tool_calls(message: dict[str, Any], where: str) -> None:
    calls = message.get("tool_calls")
    if calls is None:
        return
    if message["role"] != "assistant":
        raise MessageError(f"{where}.tool_calls", "only an assistant message makes tool calls")
    if not isinstance(calls, list):
        raise MessageError(f"{where}.tool_calls", "must be a list")
    for index, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise MessageError(
                f"{where}.tool_calls[{index}]", 'must be {"type": "function", "function": {"name", "arguments"}}'
            )
        if not isinstance(function.get("arguments", ""), str):
            raise MessageError(f"{where}.tool_calls[{index}].function.arguments", "must be a JSON string")


def messages_validate(value: Any, field_name: str = "messages") -> list[dict[str, Any]]:
    """The conversation, checked: a non-empty list of messages with known roles and text content."""
    if not isinstance(value, list) or not value:
        code = "required" if value is None else "invalid"
        raise MessageError(field_name, "must be a non-empty list of messages", code)
    if len(value) > MAX_MESSAGES:
        raise MessageError(field_name, f"holds at most {MAX_MESSAGES} messages, this one has {len(value)}")
    problem = json_problem(value, field_name)
    if problem is not None:
        raise MessageError(*problem)
    for index, message in enumerate(value):
        where = f"{field_name}[{index}]"
        if not isinstance(message, dict):
            raise MessageError(where, "must be a JSON object with 'role' and 'content'")
        role = message.get("role")
        if role not in ROLES:
            raise MessageError(f"{where}.role", f"{role!r} is not one of {', '.join(sorted(ROLES))}")
        _content(message, where)
        _tool_calls(message, where)
        if role == "tool" and not isinstance(message.get("tool_call_id"), str):
            raise MessageError(
                f"{where}.tool_call_id", "is required on a tool message (the call it answers)", "required"
            )
    return value


def tools_validate(value: Any, field_name: str = "tools") -> list[dict[str, Any]] | None:
    """The tools offered to the model: function tools, each with a name."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise MessageError(field_name, "must be a list of tools")
    problem = json_problem(value, field_name)
    if problem is not None:
        raise MessageError(*problem)
    for index, tool in enumerate(value):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(function, dict):
            raise MessageError(f"{field_name}[{index}]", 'must be {"type": "function", "function": {...}}')
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise MessageError(f"{field_name}[{index}].function.name", "is required", "required")
    return value


def turn_of(messages: list[dict[str, Any]]) -> int:
    """The turn a reply to ``messages`` is, when the client does not say: the assistant messages
    before it (0 for the first answer of a session)."""
    return sum(1 for message in messages if message.get("role") == "assistant")
