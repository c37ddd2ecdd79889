from __future__ import annotations

from typing import Any

import orjson
from rest_framework.renderers import JSONRenderer


class FastJSONRenderer(JSONRenderer):
    """orjson: several times faster than the standard library on large batch answers."""

    def render(self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None) -> bytes:
        if data is None:
            return b""
        return orjson.dumps(data, default=str, option=orjson.OPT_NON_STR_KEYS)
