from __future__ import annotations

import json
from typing import Any

import orjson
from rest_framework.renderers import JSONRenderer


class FastJSONRenderer(JSONRenderer):
    """orjson: several times faster than the standard library on large batch answers."""

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        if data is None:
            return b""
        try:
            return orjson.dumps(data, default=str, option=orjson.OPT_NON_STR_KEYS)
        except TypeError:
            # Integers beyond 64 bits: Postgres stores a JSON number such as 1e20 as an integer,
            # which reads back larger than orjson can write. The standard library writes any.
            return json.dumps(data, default=str, ensure_ascii=False, separators=(",", ":")).encode()
