"""The chat completion request as the API takes it: messages, tools, the response format and OpenAI's
other fields, each checked and bounded (the view is in ``chat_apis.py``)."""

from __future__ import annotations

import json
import re
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from apps.common.item_checks import MAX_ID_LEN
from apps.common.parsing import StrictSerializer
from apps.engines.stops import VLLM_MAX_STOP
from apps.interactions.contract import MAX_TURN
from apps.interactions.messages import MessageError, messages_validate, tools_validate
from apps.serving.schema_bounds import schema_cost_problem
from apps.serving.schemas import INT64, VLLM_MAX_LOGPROBS, LogitBiasField, OpenAIRequestIn, StopField, StreamOptionsIn

_STEP = re.compile(r"\[([0-9]+)\]|\.([A-Za-z_][A-Za-z0-9_]*)")


def nested_error(exc: MessageError) -> serializers.ValidationError:
    """A message or tool error as DRF nests a field's errors, so the error's ``param`` is its path
    (``messages[0].content`` is ``messages.0.content``) and its code the kind of mistake."""
    field = exc.field.split("[", 1)[1] if "[" in exc.field else ""
    steps = [index or name for index, name in _STEP.findall("[" + field)] if field else []
    detail: Any = [serializers.ErrorDetail(exc.message, code=exc.code)]
    for step in reversed(steps):
        detail = {step: detail}
    return serializers.ValidationError(detail)


@extend_schema_field({"type": "array", "items": {"type": "object"}})
class MessagesField(serializers.Field):
    """``messages``: OpenAI's chat messages (system, developer, user, assistant, tool), text content."""

    def to_internal_value(self, data: Any) -> list[dict[str, Any]]:
        try:
            return messages_validate(data, "messages")
        except MessageError as exc:
            raise nested_error(exc) from None

    def to_representation(self, value: Any) -> Any:
        return value


# OpenAI's own limit on tools per request.
MAX_TOOLS = 128


# Serialized as compact JSON (UTF-8): all tools together, and the response_format's json_schema.
MAX_TOOLS_BYTES = 256 * 1024


MAX_SCHEMA_BYTES = 64 * 1024


# JSON nesting levels inside a tool's `parameters` or the `json_schema` object (itself level 1):
# each nested object property of a JSON schema takes two (the schema, its `properties`).
MAX_SCHEMA_DEPTH = 20


def _depth_over(value: Any, limit: int) -> bool:
    """Whether ``value`` nests deeper than ``limit`` levels (iterative: any depth is safe)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        current, depth = stack.pop()
        if isinstance(current, dict):
            current = list(current.values())
        elif not isinstance(current, list):
            continue
        if depth > limit:
            return True
        stack.extend((inner, depth + 1) for inner in current if isinstance(inner, (dict, list)))
    return False


def _json_bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def tools_bounded(data: Any) -> None:
    """At most MAX_TOOLS tools, MAX_TOOLS_BYTES in all, each ``parameters`` MAX_SCHEMA_DEPTH deep."""
    if not isinstance(data, list):
        return  # tools_validate names the shape
    if len(data) > MAX_TOOLS:
        raise serializers.ValidationError(f"at most {MAX_TOOLS} tools, this request has {len(data)}")
    for index, tool in enumerate(data):
        function = tool.get("function") if isinstance(tool, dict) else None
        parameters = function.get("parameters") if isinstance(function, dict) else None
        if parameters is not None and _depth_over(parameters, MAX_SCHEMA_DEPTH):
            raise serializers.ValidationError(
                f"[{index}].function.parameters: nested deeper than {MAX_SCHEMA_DEPTH} levels (the limit)"
            )
    size = _json_bytes(data)
    if size > MAX_TOOLS_BYTES:
        raise serializers.ValidationError(f"{size} bytes as JSON, at most {MAX_TOOLS_BYTES} for all tools together")


@extend_schema_field({"type": "array", "items": {"type": "object"}})
class ToolsField(serializers.Field):
    """``tools``: function tools, each ``{"type": "function", "function": {"name", "parameters"}}``."""

    def to_internal_value(self, data: Any) -> list[dict[str, Any]] | None:
        if data == []:
            raise serializers.ValidationError("must not be empty: offer at least one tool, or leave it out")
        tools_bounded(data)
        try:
            return tools_validate(data, "tools")
        except MessageError as exc:
            raise nested_error(exc) from None

    def to_representation(self, value: Any) -> Any:
        return value


@extend_schema_field({"oneOf": [{"type": "string", "enum": ["none", "auto", "required"]}, {"type": "object"}]})
class ToolChoiceField(serializers.Field):
    def to_internal_value(self, data: Any) -> Any:
        if data in ("none", "auto", "required"):
            return data
        function = data.get("function") if isinstance(data, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str) and function["name"]:
            return {"type": "function", "function": {"name": function["name"]}}
        raise serializers.ValidationError(
            'must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}'
        )

    def to_representation(self, value: Any) -> Any:
        return value


class ResponseFormatIn(StrictSerializer):
    type = serializers.ChoiceField(choices=["text", "json_object", "json_schema"])
    json_schema = serializers.DictField(required=False)

    def validate_json_schema(self, value: dict[str, Any]) -> dict[str, Any]:
        if _depth_over(value, MAX_SCHEMA_DEPTH):
            raise serializers.ValidationError(f"nested deeper than {MAX_SCHEMA_DEPTH} levels (the limit)")
        size = _json_bytes(value)
        if size > MAX_SCHEMA_BYTES:
            raise serializers.ValidationError(f"{size} bytes as JSON, at most {MAX_SCHEMA_BYTES}")
        problem = schema_cost_problem(value.get("schema"))
        if problem is not None:
            raise serializers.ValidationError(problem)
        return value


def forced_tools_problem(tools: list[dict[str, Any]], tool_choice: Any) -> str | None:
    """What makes the grammar of the tools ``tool_choice`` forces too expensive (vLLM compiles the
    parameters of every tool for ``required``, of the named one for a named choice), or None."""
    if tool_choice == "required":
        forced = list(enumerate(tools))
    elif isinstance(tool_choice, dict):
        name = tool_choice["function"]["name"]
        forced = [(i, tool) for i, tool in enumerate(tools) if tool.get("function", {}).get("name") == name]
    else:
        return None
    for index, tool in forced:
        parameters = tool.get("function", {}).get("parameters")
        problem = schema_cost_problem(parameters, where=f"[{index}].function.parameters")
        if problem is not None:
            return problem
    return None


class ChatCompletionIn(OpenAIRequestIn):
    model = serializers.CharField(
        required=False, allow_blank=True, help_text="your adapter's name; default adapter if empty"
    )
    messages = MessagesField(help_text="the conversation so far; the base model's chat template renders it")
    tools = ToolsField(required=False)
    tool_choice = ToolChoiceField(required=False)
    parallel_tool_calls = serializers.BooleanField(required=False)
    response_format = ResponseFormatIn(required=False)
    prediction = serializers.DictField(
        required=False, help_text="OpenAI's predicted output, a latency hint: accepted (Continue sends it) and not used"
    )
    max_tokens = serializers.IntegerField(required=False, min_value=1, max_value=2**31 - 1)
    max_completion_tokens = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=2**31 - 1,
        help_text="served at most the adapter's max_completion_tokens (its default; more is capped, not refused)",
    )
    temperature = serializers.FloatField(required=False, min_value=0.0, max_value=2.0, default=1.0)
    top_p = serializers.FloatField(required=False, min_value=0.0001, max_value=1.0, default=1.0)
    stop = StopField(required=False, default=list)
    n = serializers.IntegerField(required=False, min_value=1, max_value=8, default=1)
    seed = serializers.IntegerField(required=False, allow_null=True, default=None, min_value=-INT64, max_value=INT64)
    user = serializers.CharField(required=False, allow_blank=True, max_length=200, default="")
    stream = serializers.BooleanField(required=False, default=False)
    stream_options = StreamOptionsIn(required=False)
    logprobs = serializers.BooleanField(required=False, default=False)
    top_logprobs = serializers.IntegerField(required=False, allow_null=True, min_value=0, max_value=VLLM_MAX_LOGPROBS)
    frequency_penalty = serializers.FloatField(required=False, min_value=-2.0, max_value=2.0)
    presence_penalty = serializers.FloatField(required=False, min_value=-2.0, max_value=2.0)
    logit_bias = LogitBiasField(required=False)
    opted_in = serializers.BooleanField(required=False, help_text="the end user's consent to learning, now")
    conversation_id = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=MAX_ID_LEN,
        default="",
        help_text="your id of the session (agents; surrounding whitespace is not part of it)",
    )
    turn = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=0,
        max_value=MAX_TURN,  # the bound a session outcome can name (apps.interactions.contract)
        help_text="0-based index of this reply in the session; default: the assistant messages before it",
    )

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if len(attrs["stop"]) > VLLM_MAX_STOP:
            raise serializers.ValidationError({"stop": f"chat takes at most {VLLM_MAX_STOP} stop sequences"})
        if attrs.get("tool_choice") not in (None, "none") and "tools" not in attrs:
            raise serializers.ValidationError({"tool_choice": "needs `tools`"})
        problem = forced_tools_problem(attrs.get("tools") or [], attrs.get("tool_choice"))
        if problem is not None:
            raise serializers.ValidationError({"tools": f"{problem} (tool_choice forces this tool)"})
        if attrs.get("top_logprobs") and not attrs["logprobs"]:
            raise serializers.ValidationError({"top_logprobs": "needs `logprobs: true`"})
        if attrs.get("turn") is not None and not attrs["conversation_id"]:
            raise serializers.ValidationError({"turn": "needs `conversation_id` (the session the turn belongs to)"})
        if "\x00" in attrs["conversation_id"]:
            raise serializers.ValidationError({"conversation_id": "contains a NUL character"})
        return attrs
