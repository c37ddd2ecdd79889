"""The JSON-schema keywords that make a structured-output grammar expensive, bounded.

vLLM compiles a ``response_format`` JSON schema (and a forced tool's ``parameters``) into a grammar
on the shared engine, and some keywords grow that grammar with a number the client picks rather
than with the schema's size: a ``pattern`` is a regular expression compiled as it stands, a large
``enum`` or ``minItems: 100000`` unrolls into that many alternatives or repetitions. Every such
keyword is refused or bounded here, far above what real schemas use (enums of a few values, lists
of a handful of items, strings of some hundreds of characters), so one tenant's request cannot
stall every tenant's compiles. The schema's size and nesting are bounded by the caller
(:mod:`apps.serving.chat_apis`).

The walk reads the schema as a schema: the names under ``properties`` and ``$defs`` are names, not
keywords (a property may be called ``pattern``), and ``enum``, ``const``, ``default`` and
``examples`` hold data, which is not walked.
"""

from __future__ import annotations

from typing import Any

# Keywords refused outright: a regular expression the client writes is compiled as written.
REFUSED_KEYWORDS = ("pattern", "patternProperties")
# Values in one `enum`.
MAX_SCHEMA_ENUM = 256
# minItems, maxItems, minContains, maxContains, minProperties, maxProperties: unrolled repetitions.
MAX_SCHEMA_COUNT = 128
# minLength, maxLength of a string.
MAX_SCHEMA_LENGTH = 1024
# `format` keywords in one schema: each known format (email, uri, date-time, ...) is a fixed regular
# expression compiled where it appears.
MAX_SCHEMA_FORMATS = 32

_COUNT_KEYWORDS = ("minItems", "maxItems", "minContains", "maxContains", "minProperties", "maxProperties")
_LENGTH_KEYWORDS = ("minLength", "maxLength")
# Keywords whose value is a schema, a list of schemas, or an object of named schemas.
_SCHEMA_KEYWORDS = (
    "items",
    "additionalItems",
    "additionalProperties",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
)
_SCHEMA_LIST_KEYWORDS = ("anyOf", "oneOf", "allOf", "prefixItems", "items")
_NAMED_SCHEMA_KEYWORDS = ("properties", "$defs", "definitions", "dependentSchemas")


def _too_large(value: Any, cap: int) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > cap


def _keyword_problem(schema: dict[str, Any], path: str) -> str | None:
    for keyword in REFUSED_KEYWORDS:
        if keyword in schema:
            return f"{path}.{keyword}: not supported (a regular expression costs the shared engine what it writes)"
    enum = schema.get("enum")
    if isinstance(enum, list) and len(enum) > MAX_SCHEMA_ENUM:
        return f"{path}.enum: {len(enum)} values, at most {MAX_SCHEMA_ENUM}"
    for keywords, cap in ((_COUNT_KEYWORDS, MAX_SCHEMA_COUNT), (_LENGTH_KEYWORDS, MAX_SCHEMA_LENGTH)):
        for keyword in keywords:
            if _too_large(schema.get(keyword), cap):
                return f"{path}.{keyword}: {schema[keyword]} is above the limit of {cap}"
    return None


def schema_cost_problem(schema: Any, *, where: str = "schema") -> str | None:
    """What makes ``schema``'s grammar too expensive (the first found, with its path), or None.

    Iterative, so any depth is safe to walk (the depth itself is the caller's bound)."""
    stack: list[tuple[Any, str]] = [(schema, where)]
    formats = 0
    while stack:
        current, path = stack.pop()
        if not isinstance(current, dict):
            continue
        problem = _keyword_problem(current, path)
        if problem is not None:
            return problem
        if isinstance(current.get("format"), str):
            formats += 1
            if formats > MAX_SCHEMA_FORMATS:
                return f"{path}.format: more than {MAX_SCHEMA_FORMATS} `format` keywords in one schema"
        for keyword in _SCHEMA_KEYWORDS:
            if isinstance(current.get(keyword), dict):
                stack.append((current[keyword], f"{path}.{keyword}"))
        for keyword in _SCHEMA_LIST_KEYWORDS:
            if isinstance(current.get(keyword), list):
                stack.extend((inner, f"{path}.{keyword}[{i}]") for i, inner in enumerate(current[keyword]))
        for keyword in _NAMED_SCHEMA_KEYWORDS:
            if isinstance(current.get(keyword), dict):
                stack.extend((inner, f"{path}.{keyword}.{name[:40]}") for name, inner in current[keyword].items())
    return None
