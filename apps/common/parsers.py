"""A strict, fast JSON parser for the API.

orjson refuses NaN/Infinity and invalid UTF-8, which the standard library accepts or turns
into confusing errors; both are answered 400 with a message that says what was wrong.
"""

from __future__ import annotations

import re
from typing import Any

import orjson
from django.conf import settings
from rest_framework.parsers import BaseParser

from apps.common.exceptions import PayloadTooLarge, ValidationFailed


class StrictJSONParser(BaseParser):
    media_type = "application/json"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        limit = settings.STROP_MAX_BODY_BYTES
        body = stream.read(limit + 1) if stream is not None else b""
        if len(body) > limit:
            raise PayloadTooLarge(
                f"request body is larger than {limit} bytes; split the batch",
                details={"limit_bytes": limit},
            )
        return parse_json_bytes(body)


def parse_json_bytes(body: bytes) -> Any:
    if not body:
        raise ValidationFailed("request body is empty; send a JSON document", code="malformed_json")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        text = str(exc)
        if "utf-8" in text.lower() or "surrogate" in text.lower():
            raise ValidationFailed(f"request body is not valid UTF-8: {text}", code="invalid_utf8") from exc
        if "infinity" in text.lower() or re.search(rb"[:\[,]\s*-?(NaN|Infinity)\b", body):
            raise ValidationFailed(f"NaN and Infinity are not JSON numbers: {text}", code="non_finite_number") from exc
        raise ValidationFailed(f"malformed JSON: {text}", code="malformed_json") from exc
