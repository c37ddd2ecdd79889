"""Strict parsing of what arrives outside JSON bodies: path ids and query parameters; and strict
serializers for what arrives inside them.

Python's ``int()`` takes ``" 2"``, ``"0_2"`` and ``"２"`` (a full-width digit), so a lenient id
parse lets many spellings reach one object and hides typos in query parameters. Here an id is
ASCII digits only, and a query parameter that is not what it should be is a 400 naming it.
"""

from __future__ import annotations

import base64
import copy
import functools
import json
import re
from typing import Any

from django.conf import settings
from rest_framework import serializers

from apps.common.exceptions import NotFound, PayloadTooLarge, ValidationFailed

_DIGITS = re.compile(r"(?:0|[1-9][0-9]{0,17})")  # fits a signed 64-bit integer


def parse_id(value: int | str, *, what: str) -> int:
    """A numeric id from a URL path; anything but plain ASCII digits is a 404 for ``what``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if not isinstance(value, str) or not _DIGITS.fullmatch(value):
        raise NotFound(f"{what} {str(value)[:64]!r} not found")
    return int(value)


def body_read(stream: Any) -> bytes:
    """A request body of at most ``STROP_MAX_BODY_BYTES``; a longer one is a 413, never cut short
    (a parser that read only the first part would answer for part of the data as if it were all)."""
    limit = settings.STROP_MAX_BODY_BYTES
    body: bytes = stream.read(limit + 1) if stream is not None else b""
    if len(body) > limit:
        raise PayloadTooLarge(
            f"request body is larger than {limit} bytes; split it", details={"limit_bytes": limit}
        )
    return body


def query_int(params: Any, name: str, *, default: int, minimum: int, maximum: int) -> int:
    """An integer query parameter in [minimum, maximum]; absent gives ``default``, anything else a 400."""
    raw = params.get(name)
    if raw is None:
        return default
    if not _DIGITS.fullmatch(raw) or not minimum <= int(raw) <= maximum:
        raise ValidationFailed(f"{name}: must be an integer from {minimum} to {maximum}, not {raw[:64]!r}")
    return int(raw)


def query_bool(params: Any, name: str) -> bool | None:
    """``true``/``false`` (also 1/0); absent gives None, anything else a 400."""
    raw = params.get(name)
    if raw is None:
        return None
    lowered = raw.lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise ValidationFailed(f"{name}: must be true or false, not {raw[:64]!r}")


def query_text(params: Any, name: str, *, max_length: int = 200) -> str | None:
    raw = params.get(name)
    if raw is not None and (len(raw) > max_length or "\x00" in raw):
        raise ValidationFailed(f"{name}: must be at most {max_length} characters without NUL")
    return raw


# Room for a 200-character position of 4-byte UTF-8 characters in base64 (and the JSON around it).
_CURSOR = re.compile(r"[A-Za-z0-9_-]{1,1200}")


def cursor_encode(after: str) -> str:
    """The opaque ``cursor`` of a keyset page that starts after the position ``after`` (a list's
    sort key): base64url of a small JSON object, so its form can change without clients noticing."""
    text = json.dumps({"after": after}, ensure_ascii=False, separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def query_cursor(params: Any, name: str = "cursor", *, max_length: int = 200) -> str | None:
    """The position a ``cursor`` query parameter (made by :func:`cursor_encode`) names; absent
    gives None, anything no page could have given (mangled, cut short, a NUL byte) a 400."""
    raw = params.get(name)
    if raw is None:
        return None
    after = None
    if _CURSOR.fullmatch(raw):
        try:
            data = json.loads(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        except ValueError:  # not base64, not UTF-8 or not JSON: all ValueErrors
            data = None
        if isinstance(data, dict) and set(data) == {"after"}:
            after = data["after"]
    if not isinstance(after, str) or not after or len(after) > max_length or "\x00" in after or not _utf8(after):
        raise ValidationFailed(
            f"{name}: {raw[:64]!r} is not a cursor this list gave; send a page's next_cursor unchanged, "
            "or leave it out for the first page"
        )
    return after


def _utf8(text: str) -> bool:
    """False for a string the database could not take (a lone surrogate, which JSON can spell)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def reject_unknown_query(params: Any, allowed: set[str]) -> None:
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ValidationFailed(
            f"{unknown[0]}: is not a query parameter here (known: {', '.join(sorted(allowed)) or 'none'})",
            code="unknown_field",
        )


# An end user id names a resource of the API (``/v1/users/<id>``, ``…/opt-in``, ``…/opt-out``), so
# ingest takes only ids the API can address: a "/" would split the path, "." and ".." are
# normalised away by HTTP clients, and "import" is the route of the bulk import.
MAX_END_USER_ID = 200
RESERVED_END_USER_IDS = frozenset({".", "..", "import"})


def end_user_id_problem(value: Any) -> str | None:
    """Why ``value`` cannot be an end user id, or None when it can (the one rule, used wherever an
    end user id enters: ingest, serving, editor outcomes, consent, assignment)."""
    if not isinstance(value, str):
        return f"must be a string, not {type(value).__name__}"
    if not value.strip():
        return "must not be blank"
    if len(value) > MAX_END_USER_ID:
        return f"is longer than {MAX_END_USER_ID} characters"
    if "\x00" in value:
        return "contains a NUL character, which cannot be stored"
    if "/" in value:
        return "must not contain '/': the id must be addressable as /v1/users/<id>"
    if value in RESERVED_END_USER_IDS:
        return f"{value!r} is reserved (it cannot be addressed as /v1/users/<id>)"
    return None


def header_text(headers: Any, name: str) -> str:
    """The header ``name`` as the client wrote it, stripped ("" when absent). A server hands header
    values over decoded byte for byte (Latin-1). Clients differ: curl or Go send a string's UTF-8
    bytes, Node (Continue) and Python's http.client its Latin-1 ones. Bytes that read as UTF-8 are
    read so ("josé" from curl stays "josé", not "josÃ©"); others keep their Latin-1 reading ("josé"
    from Node is the byte 0xE9, not UTF-8): the same name is one end user either way."""
    value = headers.get(name, "")
    try:
        return value.encode("latin-1").decode("utf-8").strip()
    except (UnicodeEncodeError, UnicodeDecodeError):
        return value.strip()


def end_user_id_check(value: Any, *, field_name: str = "end_user_id") -> str:
    """``value`` when it is an addressable end user id; else a 400 naming ``field_name``."""
    problem = end_user_id_problem(value)
    if problem is not None:
        raise ValidationFailed(f"{field_name}: {problem}", details={"field": field_name})
    return value


# DRF's fields (these classes exactly, not subclasses) whose state after ``__init__`` is settings and
# lists read only (validators, error messages): a shallow copy of an unbound one is a field of its
# own once bound. Anything else (a child field, fields of its own, our own classes) is copied as DRF
# does.
_FLAT_FIELDS = (
    serializers.BooleanField,
    serializers.CharField,
    serializers.ChoiceField,
    serializers.DateTimeField,
    serializers.DecimalField,
    serializers.FloatField,
    serializers.IntegerField,
    serializers.JSONField,
    serializers.UUIDField,
)


@functools.cache
def _field_templates(cls: type[serializers.Serializer]) -> tuple[tuple[str, serializers.Field, bool], ...]:
    """``cls``'s declared fields, copied once and never bound: (name, field, whether it is flat)."""
    fields = copy.deepcopy(cls._declared_fields)  # type: ignore[attr-defined]
    return tuple((name, field, _flat(field)) for name, field in fields.items())


_IMMUTABLE = (str, bytes, int, float, bool, type(None), tuple, frozenset)


def _flat(field: serializers.Field) -> bool:
    """Whether a shallow copy of ``field`` shares nothing a request could change: one of
    ``_FLAT_FIELDS`` whose default and initial value are immutable or made anew by a call (a ``[]``
    default would be one list for every request)."""
    shared = (field.default, field.initial)
    return type(field) in _FLAT_FIELDS and all(
        value is serializers.empty or callable(value) or isinstance(value, _IMMUTABLE) for value in shared
    )


class StrictSerializer(serializers.Serializer):
    """A serializer that refuses fields it does not know, naming the first one (nested ones too).

    Its fields are copies of unbound templates, as DRF's are of the declared ones, but a flat field
    (``_FLAT_FIELDS``) is copied shallowly instead of rebuilt: DRF's deep copy runs every field's
    ``__init__`` again on each request, 5 % of an API process's CPU on the completion endpoint
    (py-spy, 2026-11-28)."""

    def get_fields(self) -> dict[str, serializers.Field]:
        return {
            name: copy.copy(field) if flat else copy.deepcopy(field)
            for name, field, flat in _field_templates(type(self))
        }

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = set(data) - set(self.fields)
            if unknown:
                known = ", ".join(sorted(self.fields))
                raise serializers.ValidationError(
                    {sorted(unknown)[0]: f"is not a known field (known: {known})"}, code="unknown_field"
                )
        return super().to_internal_value(data)


_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def is_uuid(value: Any) -> bool:
    """The canonical 36-character form only (``uuid.UUID`` also takes braces, URNs and no dashes)."""
    return isinstance(value, str) and _UUID.fullmatch(value) is not None


# Deeper metadata is refused rather than stored: nothing we read goes this deep, and walking (or
# letting Postgres parse) thousands of levels is a way to make a request expensive.
MAX_JSON_DEPTH = 32


def json_problem(value: Any, path: str) -> tuple[str, str] | None:
    """(where, problem) of the first NUL character (Postgres cannot store them) or nesting deeper
    than MAX_JSON_DEPTH in a JSON value; None when there is neither.

    Iterative, so no nesting the JSON parser accepts can exhaust Python's recursion limit."""
    stack: list[tuple[Any, str, int]] = [(value, path, 1)]
    while stack:
        current, where, depth = stack.pop()
        if isinstance(current, str):
            if "\x00" in current:
                return where, "contains a NUL character, which cannot be stored"
            continue
        if not isinstance(current, (dict, list)):
            continue
        if depth > MAX_JSON_DEPTH:
            return path, f"is nested deeper than {MAX_JSON_DEPTH} levels"
        if isinstance(current, dict):
            for key, inner in current.items():
                if "\x00" in key:
                    return where, "has a key with a NUL character"
                stack.append((inner, f"{where}.{key}", depth + 1))
        else:
            stack.extend((inner, f"{where}[{index}]", depth + 1) for index, inner in enumerate(current))
    return None
