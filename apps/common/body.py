"""Request bodies sent with ``Transfer-Encoding: chunked`` (no Content-Length): read, or refused.

Django reads a body of exactly Content-Length bytes, and a chunked request has none: its body
would silently read as empty and the data be lost. When the WSGI server has de-chunked the body
and marks the input as terminated (gunicorn does: ``wsgi.input_terminated``), the body is read
here, up to the size limit, and handed to Django with its length. A server that cannot tell
where such a body ends gets a 411, never a silently empty body.
"""

from __future__ import annotations

import io
from collections.abc import Callable

from django.conf import settings
from django.core.handlers.wsgi import LimitedStream
from django.http import HttpRequest, HttpResponse, JsonResponse

from apps.common.exception_handler import error_body


class ChunkedBodyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        meta = request.META
        chunked = "chunked" in meta.get("HTTP_TRANSFER_ENCODING", "").lower()
        if chunked and not meta.get("CONTENT_LENGTH"):
            refusal = self._read_whole_body(request)
            if refusal is not None:
                return refusal
        return self.get_response(request)

    @staticmethod
    def _read_whole_body(request: HttpRequest) -> HttpResponse | None:
        meta = request.META
        if not meta.get("wsgi.input_terminated"):
            return JsonResponse(
                error_body(
                    "length_required",
                    "send the body with a Content-Length header; this server cannot read a chunked body",
                ),
                status=411,
            )
        limit = settings.STROP_MAX_BODY_BYTES
        body = meta["wsgi.input"].read(limit + 1)
        if len(body) > limit:
            return JsonResponse(
                error_body(
                    "payload_too_large",
                    f"request body is larger than {limit} bytes; split the batch",
                    {"limit_bytes": limit},
                ),
                status=413,
            )
        meta["CONTENT_LENGTH"] = str(len(body))
        request._stream = LimitedStream(io.BytesIO(body), len(body))  # type: ignore[assignment]
        return None
