"""Chat requests' schemas (``tools``, ``response_format``) are bounded before they reach the shared
vLLM engine: past a bound, a 400 that names the field and the limit, and nothing sent or recorded."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from apps.interactions.models import Interaction, ServingFailure
from apps.serving.chat_schemas import MAX_SCHEMA_BYTES, MAX_SCHEMA_DEPTH, MAX_TOOLS, MAX_TOOLS_BYTES
from apps.serving.schema_bounds import MAX_SCHEMA_COUNT, MAX_SCHEMA_ENUM, MAX_SCHEMA_FORMATS, MAX_SCHEMA_LENGTH

pytestmark = pytest.mark.django_db

MESSAGES = [{"role": "user", "content": "Rename x to count"}]


def _tool(name: str, parameters: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "parameters": parameters or {"type": "object"}}}


def _nested_schema(levels: int) -> dict[str, Any]:
    """A JSON schema of objects inside objects; each level adds two JSON levels."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"inner": schema}}
    return schema


@pytest.fixture
def tripwire(settings) -> Iterator[socket.socket]:
    """vLLM's address, as Strop sees it, is a socket that only notes whether anyone connected."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    settings.VLLM_BASE_URLS = [f"http://127.0.0.1:{sock.getsockname()[1]}"]
    try:
        yield sock
    finally:
        sock.close()


def _nobody_connected(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        sock.accept()[0].close()
    except BlockingIOError:
        return True
    return False


@pytest.fixture
def client(make_tenant, make_client):
    return make_client(make_tenant("schemas"), scopes=["serve"])


OVER_THE_BOUNDS = [
    pytest.param({"tools": [_tool(f"t{i}") for i in range(MAX_TOOLS + 1)]}, "tools", str(MAX_TOOLS), id="tool-count"),
    pytest.param(
        {"tools": [_tool("big", {"type": "object", "description": "x" * MAX_TOOLS_BYTES})]},
        "tools",
        str(MAX_TOOLS_BYTES),
        id="tools-bytes",
    ),
    pytest.param(
        {"tools": [_tool("fine"), _tool("deep", _nested_schema(MAX_SCHEMA_DEPTH // 2))]},
        "tools",
        f"[1].function.parameters: nested deeper than {MAX_SCHEMA_DEPTH} levels",
        id="tool-depth",
    ),
    pytest.param(
        {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": _nested_schema(10)}}},
        "json_schema",
        f"nested deeper than {MAX_SCHEMA_DEPTH} levels",
        id="schema-depth",
    ),
    pytest.param(
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "r", "schema": {"type": "string", "description": "x" * MAX_SCHEMA_BYTES}},
            }
        },
        "json_schema",
        f"at most {MAX_SCHEMA_BYTES}",
        id="schema-bytes",
    ),
]


@pytest.mark.parametrize("extra, field, limit", OVER_THE_BOUNDS)
def test_a_schema_past_its_bound_is_a_400_naming_the_field_and_limit_and_never_reaches_vllm(
    client, tripwire, extra: dict[str, Any], field: str, limit: str
):
    response = client.post("/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 4, **extra}, format="json")
    assert response.status_code == 400, response.content
    error = json.dumps(response.json()["error"])
    assert field in error and limit in error, error
    assert _nobody_connected(tripwire)
    assert not Interaction.objects.exists() and not ServingFailure.objects.exists()


def test_schemas_the_size_real_clients_send_pass_the_bounds():
    """Continue's and the openai client's shapes, and the bounds themselves, are not refused."""
    from rest_framework import serializers

    from apps.serving.chat_schemas import ResponseFormatIn, tools_bounded

    tools_bounded([_tool(f"t{i}", _nested_schema(4)) for i in range(MAX_TOOLS)])
    # parameters object + (properties, inner) per level: 1 + 2 * levels JSON levels
    tools_bounded([_tool("deepest", _nested_schema((MAX_SCHEMA_DEPTH - 1) // 2))])
    with pytest.raises(serializers.ValidationError):
        tools_bounded([_tool("deeper", _nested_schema((MAX_SCHEMA_DEPTH - 1) // 2 + 1))])
    schema = {"type": "json_schema", "json_schema": {"name": "r", "schema": _nested_schema(8), "strict": True}}
    assert ResponseFormatIn(data=schema).is_valid(), ResponseFormatIn(data=schema).errors


@pytest.mark.vllm
def test_a_json_schema_response_format_within_the_bounds_is_served_by_vllm(serve_client, serving_adapter):
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    response = serve_client.post(
        "/v1/chat/completions",
        {
            "model": "autocomplete",
            "messages": MESSAGES,
            "max_tokens": 8,
            "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}},
            "tools": [_tool("edit_file", {"type": "object", "properties": {"path": {"type": "string"}}})],
        },
        format="json",
    )
    assert response.status_code == 200, response.content
    assert Interaction.objects.filter(pk=response.json()["id"]).exists()


def _response_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}}


def _object(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties}


EXPENSIVE_KEYWORDS = [
    pytest.param(
        _object(code={"type": "string", "pattern": "^(a|b)*c{1,900}$"}), "properties.code.pattern", id="pattern"
    ),
    pytest.param(
        {"type": "object", "patternProperties": {"^x-": {"type": "string"}}},
        "schema.patternProperties",
        id="pattern-props",
    ),
    pytest.param(
        _object(pick={"enum": [f"v{i}" for i in range(MAX_SCHEMA_ENUM + 1)]}),
        f"{MAX_SCHEMA_ENUM + 1} values, at most {MAX_SCHEMA_ENUM}",
        id="enum",
    ),
    pytest.param(
        _object(rows={"type": "array", "items": {"type": "integer"}, "minItems": 100000}),
        f"minItems: 100000 is above the limit of {MAX_SCHEMA_COUNT}",
        id="min-items",
    ),
    pytest.param(
        {"type": "array", "items": {"type": "string"}, "maxItems": MAX_SCHEMA_COUNT + 1}, "maxItems", id="max-items"
    ),
    pytest.param(
        _object(text={"type": "string", "minLength": MAX_SCHEMA_LENGTH + 1}),
        f"minLength: {MAX_SCHEMA_LENGTH + 1} is above the limit of {MAX_SCHEMA_LENGTH}",
        id="min-length",
    ),
    pytest.param(_object(text={"type": "string", "maxLength": 10**9}), "maxLength", id="max-length"),
    pytest.param({"type": "object", "minProperties": 5000}, "minProperties", id="min-properties"),
    pytest.param(
        {"$defs": {"deep": {"anyOf": [{"type": "null"}, {"type": "string", "pattern": "x+"}]}}, "$ref": "#/$defs/deep"},
        "schema.$defs.deep.anyOf[1].pattern",
        id="pattern-in-defs",
    ),
    pytest.param(
        _object(**{f"f{i}": {"type": "string", "format": "email"} for i in range(MAX_SCHEMA_FORMATS + 1)}),
        f"more than {MAX_SCHEMA_FORMATS} `format` keywords",
        id="formats",
    ),
]


@pytest.mark.parametrize("schema, says", EXPENSIVE_KEYWORDS)
def test_a_response_format_with_a_keyword_that_makes_its_grammar_expensive_is_a_400(
    client, tripwire, schema: dict[str, Any], says: str
):
    body = {"messages": MESSAGES, "max_tokens": 4, **_response_format(schema)}
    response = client.post("/v1/chat/completions", body, format="json")
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid" and error["param"] == "response_format.json_schema", error
    assert error["message"].startswith("response_format.json_schema: "), error
    assert "response_format" in error["details"] and says in error["message"], error
    assert _nobody_connected(tripwire)
    assert not Interaction.objects.exists() and not ServingFailure.objects.exists()


def test_a_tool_the_tool_choice_forces_is_bounded_like_a_response_format(client, tripwire):
    tools = [_tool("free", _object(id={"type": "string", "pattern": "[a-z]+"})), _tool("fine", _object())]
    body = {"messages": MESSAGES, "max_tokens": 4, "tools": tools}
    for tool_choice in ("required", {"type": "function", "function": {"name": "free"}}):
        response = client.post("/v1/chat/completions", {**body, "tool_choice": tool_choice}, format="json")
        assert response.status_code == 400, response.content
        error = response.json()["error"]
        assert error["message"].startswith("tools: [0].function.parameters.properties.id.pattern: not supported")
        assert "tools" in error["details"]
    assert _nobody_connected(tripwire)


def test_keywords_are_read_as_schema_keywords_only():
    """A property named `pattern`, an enum's values and a default are not keywords; bounds themselves pass."""
    from apps.serving.schema_bounds import schema_cost_problem

    fine = {
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "maxLength": MAX_SCHEMA_LENGTH, "format": "date-time"},
            "kind": {"enum": [{"pattern": "x"}] + [f"v{i}" for i in range(MAX_SCHEMA_ENUM - 1)]},
            "rows": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": MAX_SCHEMA_COUNT},
        },
        "default": {"pattern": "y", "minItems": 10**6},
        "required": ["pattern"],
    }
    assert schema_cost_problem(fine) is None
