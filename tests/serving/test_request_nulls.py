"""An optional field sent as null is taken as not sent, as OpenAI's API takes it (clients other than
the official one send explicit nulls); a required field, and one whose null means something, keep
their rules."""

from __future__ import annotations

import pytest

from apps.serving.chat_schemas import ChatCompletionIn
from apps.serving.schemas import CompletionIn

COMPLETION_NULLS = (
    "model", "suffix", "max_tokens", "temperature", "top_p", "stop", "n", "best_of", "user", "stream",
    "stream_options", "echo", "logit_bias", "frequency_penalty", "presence_penalty", "logprobs", "seed",
)  # fmt: skip
CHAT_NULLS = (
    "model", "tools", "tool_choice", "parallel_tool_calls", "response_format", "max_tokens", "max_completion_tokens",
    "temperature", "top_p", "stop", "n", "seed", "user", "stream", "stream_options", "logprobs", "top_logprobs",
    "frequency_penalty", "presence_penalty", "logit_bias",
)  # fmt: skip


def _set(data: dict) -> dict:
    """What a request set (a field whose null means something of its own is kept as None)."""
    return {key: value for key, value in data.items() if value is not None}


def test_a_completion_with_every_optional_field_null_is_served_with_the_defaults():
    body = {"prompt": "def f():\n    ", **dict.fromkeys(COMPLETION_NULLS)}
    taken = CompletionIn(data=body)
    assert taken.is_valid(), taken.errors
    plain = CompletionIn(data={"prompt": "def f():\n    "})
    assert plain.is_valid()
    assert _set(taken.validated_data) == _set(plain.validated_data)


def test_a_chat_request_with_every_optional_field_null_is_served_with_the_defaults():
    messages = [{"role": "user", "content": "hi"}]
    taken = ChatCompletionIn(data={"messages": messages, **dict.fromkeys(CHAT_NULLS)})
    assert taken.is_valid(), taken.errors
    plain = ChatCompletionIn(data={"messages": messages})
    assert plain.is_valid()
    assert _set(taken.validated_data) == _set(plain.validated_data)
    options = ChatCompletionIn(data={"messages": messages, "stream": True, "stream_options": {"include_usage": None}})
    assert options.is_valid(), options.errors
    assert options.validated_data["stream_options"] == {"include_usage": False}


@pytest.mark.parametrize(
    ("schema", "body", "field"),
    [
        (ChatCompletionIn, {"messages": None}, "messages"),  # required: a null is no conversation
        (CompletionIn, {"prompt": None}, "prompt"),  # neither prompt nor prefix
        (CompletionIn, {"prompt": "x", "nope": None}, "nope"),  # unknown, null or not
    ],
)
def test_a_null_where_a_value_is_needed_is_still_refused_by_name(schema, body, field):
    taken = schema(data=body)
    assert not taken.is_valid()
    assert field in taken.errors


@pytest.fixture(scope="module")
def components() -> dict:
    from drf_spectacular.generators import SchemaGenerator

    return SchemaGenerator().get_schema(request=None, public=True)["components"]["schemas"]


@pytest.mark.parametrize(("component", "nulls"), [("CompletionIn", COMPLETION_NULLS), ("ChatCompletionIn", CHAT_NULLS)])
def test_the_published_schema_says_each_optional_field_may_be_null(components, component, nulls):
    properties = components[component]["properties"]
    assert [name for name in nulls if not properties[name].get("nullable")] == []
    assert properties["stream_options"]["allOf"] == [{"$ref": "#/components/schemas/StreamOptionsIn"}]
    assert components[component].get("required", []) == (["messages"] if component == "ChatCompletionIn" else [])
    assert "nullable" not in properties.get("messages", {})
