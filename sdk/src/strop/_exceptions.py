"""Typed errors. Every API error answer is ``{"error": {"code", "message", "details"}}``; the class
says the status, the attributes carry the rest, so callers branch on types and fields, never on
message text."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIStatusError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitError",
    "ServiceUnavailableError",
    "StreamError",
    "StropError",
]


class StropError(Exception):
    """Base of every error this SDK raises.

    ``status`` is the HTTP status (None when no answer arrived), ``code`` the API's error code
    (``"invalid"``, ``"not_found"``, ``"rate_limited"``...), ``field`` the request field the error
    names when the API says so, ``details`` the API's details object and ``body`` the raw answer
    (parsed JSON, or text when it was not JSON).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        field: str | None = None,
        details: Any = None,
        body: Any = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.field = field
        self.details = details if details is not None else {}
        self.body = body
        self.retry_after = retry_after

    def __str__(self) -> str:
        prefix = f"{self.status} " if self.status is not None else ""
        code = f"[{self.code}] " if self.code else ""
        return f"{prefix}{code}{self.message}"


class APIStatusError(StropError):
    """The API answered with an error status. Subclasses name the common ones."""


class BadRequestError(APIStatusError):
    """400: the request is malformed or a field is invalid (see ``field``)."""


class AuthenticationError(APIStatusError):
    """401: the API key is missing, invalid or revoked."""


class PermissionDeniedError(APIStatusError):
    """403: the key lacks the scope this call needs."""


class NotFoundError(APIStatusError):
    """404: no such object for this tenant (another tenant's id looks the same)."""


class ConflictError(APIStatusError):
    """409: the object is not in a state that allows this call."""


class PayloadTooLargeError(APIStatusError):
    """413: the batch has too many items or the body is too large."""


class RateLimitError(APIStatusError):
    """429: the tenant is over its per-minute limit; ``retry_after`` says when to come back."""


class APIError(APIStatusError):
    """A 5xx answer: the server or one of its dependencies failed."""


class ServiceUnavailableError(APIError):
    """503: a dependency (vLLM, the database) is down or too slow; ``retry_after`` when given."""


class StreamError(APIError):
    """A streamed completion carried an error event after it had started (``status`` is the
    stream's HTTP status, 200)."""


class APIConnectionError(StropError):
    """No answer: the connection failed or broke."""


class APITimeoutError(APIConnectionError):
    """No answer within the timeout."""


_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    429: RateLimitError,
    503: ServiceUnavailableError,
}


# The API's messages start with the field they are about: "outcome: 'maybe' is not one of ...".
_FIELD_PREFIX = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:[.\[][A-Za-z0-9_\]]*)*): ")


def _field_of(code: str | None, message: str, details: Any) -> str | None:
    """The request field an error names: ``details.field`` when the API gives it, else the first
    key of a per-field validation detail (``{"outcome": ["..."]}``), else the field the message
    starts with."""
    if isinstance(details, dict) and details:
        field = details.get("field")
        if isinstance(field, str):
            return field
        first_key, first_value = next(iter(details.items()))
        if code == "invalid" and isinstance(first_value, (list, dict)) and first_key != "non_field_errors":
            return str(first_key)
    match = _FIELD_PREFIX.match(message)
    return match.group(1) if match else None


def error_from_body(
    status: int | None,
    body: Any,
    *,
    cls: type[StropError] | None = None,
    retry_after: float | None = None,
) -> StropError:
    """An error built from a parsed answer body (a dict in the API's error shape, or anything)."""
    if cls is None:
        if status is None:
            cls = APIError
        elif status in _BY_STATUS:
            cls = _BY_STATUS[status]
        elif status >= 500:
            cls = APIError
        else:
            cls = APIStatusError
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        code = error.get("code")
        code = str(code) if code is not None else None
        details = error.get("details")
        message = str(error.get("message") or code or f"HTTP {status}")
        field = _field_of(code, message, details)
    else:
        code, details, field = None, None, None
        text = body if isinstance(body, str) else (json.dumps(body) if body is not None else "")
        message = text.strip()[:500] or f"HTTP {status}"
    return cls(message, status=status, code=code, field=field, details=details, body=body, retry_after=retry_after)


def error_from_response(response: httpx.Response, *, retry_after: float | None = None) -> StropError:
    """The typed error for an answer whose body has been read."""
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    return error_from_body(response.status_code, body, retry_after=retry_after)


def error_from_transport(exc: httpx.TransportError) -> APIConnectionError:
    if isinstance(exc, httpx.TimeoutException):
        return APITimeoutError(f"request timed out ({type(exc).__name__}): {exc}")
    return APIConnectionError(f"connection failed ({type(exc).__name__}): {exc}")
