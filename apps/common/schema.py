"""The OpenAPI schema, made true: every operation documents the errors it can answer.

Every API view can answer the one error shape with these statuses (authentication, scope, rate
limit, body size and malformed JSON are checked before any view code runs), so a post-processing
hook adds them to every operation instead of each view listing them.
"""

from __future__ import annotations

from typing import Any

ERROR_SCHEMA_NAME = "Error"

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code", "details"],
            "properties": {
                "message": {"type": "string", "description": "what is wrong, naming the field"},
                "type": {
                    "type": "string",
                    "description": "the status's family, as OpenAI names it: invalid_request_error, "
                    "authentication_error, permission_error, not_found_error, conflict_error, rate_limit_error, "
                    "server_error",
                },
                "param": {
                    "type": "string",
                    "nullable": True,
                    "description": "the request field at fault (max_tokens, messages.0.content); null when none is",
                },
                "code": {"type": "string", "description": "the kind of mistake: invalid, required, model_not_found..."},
                "details": {"description": "the offending field and values, when there are any"},
            },
        }
    },
}

# Status → when it happens. Every authenticated operation can answer all of these.
ERRORS: dict[str, str] = {
    "400": "Bad input: malformed JSON, wrong types, unknown fields, values out of range.",
    "401": "Missing, invalid or revoked API key.",
    "403": "The key lacks the scope this operation needs.",
    "404": "Not found, or another tenant's.",
    "405": "Method not allowed on this path.",
    "409": "Conflicts with the current state (for example a run already going).",
    "411": "A request body without a length that cannot be read.",
    "413": "Body or batch too large.",
    "415": "The body is not JSON (or the media type this operation takes).",
    "429": "Over the tenant's rate limit; see Retry-After.",
    "503": "A dependency (vLLM, the database) is down or too slow; see Retry-After.",
}


def add_error_responses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    """drf-spectacular post-processing hook: the error shape, and each status on every API operation."""
    components = result.setdefault("components", {}).setdefault("schemas", {})
    components[ERROR_SCHEMA_NAME] = ERROR_SCHEMA
    reference = {"$ref": f"#/components/schemas/{ERROR_SCHEMA_NAME}"}
    for path, operations in result.get("paths", {}).items():
        if not path.startswith("/v1/"):
            continue
        for method, operation in operations.items():
            if method.startswith("x-") or not isinstance(operation, dict):
                continue
            responses = operation.setdefault("responses", {})
            for status, description in ERRORS.items():
                responses.setdefault(
                    status, {"description": description, "content": {"application/json": {"schema": reference}}}
                )
    return result
