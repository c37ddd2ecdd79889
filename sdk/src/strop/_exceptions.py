"""Typed errors. Every API error answer is OpenAI's error object with Strop's details,
``{"error": {"message", "type", "param", "code", "details"}}``; the class says what happened (one
per status, as openai-python's), the attributes carry the rest, so callers branch on types, codes
and fields, never on message text.

::

    StropError                      everything the SDK raises (a missing API key too)
    └── APIError                    anything that went wrong talking to the API
        ├── APIStatusError          an error status (4xx, 5xx); one subclass per common status
        ├── APIConnectionError      no answer (refused, broken) ── APITimeoutError
        ├── APIResponseValidationError  an answer the SDK cannot read (not JSON...)
        └── StreamError             an error event inside a stream that had started
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx

__all__ = [
    "APIConnectionError",
    "APIError",
    "APIResponseValidationError",
    "APIStatusError",
    "APITimeoutError",
    "AuthenticationError",
    "BadRequestError",
    "ConflictError",
    "InternalServerError",
    "NotFoundError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "RateLimitError",
    "ServiceUnavailableError",
    "StreamError",
    "StropError",
    "UnprocessableEntityError",
]


# A Strop API key: ``strop_<prefix>_<secret>``. The prefix is public (the dashboard lists it); the
# secret never appears in an error's text, whoever wrote that text (the server, a proxy, httpx).
_KEY = re.compile(r"\b(strop_[0-9a-f]{12}_)[A-Za-z0-9_\-]+")
_BEARER = re.compile(r"(?i)^\s*bearer\s+(\S+)\s*$")


def mask_key(key: str) -> str:
    """How a key is shown: its public prefix, never its secret (``strop_1a2b3c4d5e6f_***``)."""
    match = _KEY.match(key)
    return f"{match.group(1)}***" if match else "***"


def redact(text: str, *secrets: str | None) -> str:
    """``text`` without any Strop API key's secret, nor any of ``secrets`` (another key a proxy takes)."""
    text = _KEY.sub(lambda match: f"{match.group(1)}***", text)
    for secret in secrets:
        if secret and len(secret) >= 8:
            text = text.replace(secret, mask_key(secret))
    return text


def _bearer_of(request: httpx.Request | None) -> str | None:
    match = _BEARER.match(request.headers.get("authorization", "")) if request is not None else None
    return match.group(1) if match else None


class StropError(Exception):
    """Base of every error this SDK raises, configuration errors included.

    Every error has the attributes of :class:`APIError` (None, or ``{}`` for ``details``, where
    they do not apply), so code that catches ``StropError`` can read ``status_code`` or
    ``request_id`` without checking the class first.
    """

    def __init__(self, message: str) -> None:
        message = redact(message)
        super().__init__(message)
        self.message = message
        self.status_code: int | None = None
        self.request_id: str | None = None
        self.code: str | None = None
        self.type: str | None = None
        self.param: str | None = None
        self.details: Any = {}
        self.body: Any = None
        self.retry_after: float | None = None
        self.request: httpx.Request | None = None
        self.response: httpx.Response | None = None

    @property
    def status(self) -> int | None:
        """The earlier name of :attr:`status_code`."""
        return self.status_code

    @property
    def field(self) -> str | None:
        """The earlier name of :attr:`param`."""
        return self.param

    def __str__(self) -> str:
        prefix = f"{self.status_code} " if self.status_code is not None else ""
        code = f"[{self.code}] " if self.code else ""
        return redact(f"{prefix}{code}{self.message}", _bearer_of(self.request))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"


class APIError(StropError):
    """Something went wrong talking to the API: an error status, no answer, an unreadable answer,
    or an error event in a stream.

    ``status_code`` is the HTTP status (None when no answer arrived); ``request_id`` the answer's
    ``X-Request-ID`` (quote it when you report a problem; None without an answer); ``code`` the
    API's error code, the kind of mistake (``"invalid"``, ``"model_not_found"``, ``"rate_limited"``...);
    ``type`` the status's family (``"invalid_request_error"``, ``"not_found_error"``...); ``param``
    the request field the error names (``"max_tokens"``, ``"messages.0.content"``), None when none;
    ``details`` the API's details object; ``body`` the answer (parsed JSON, or text when it was not
    JSON); ``retry_after`` the seconds of the server's ``Retry-After``; ``request`` and ``response``
    the ``httpx`` objects, where there were some.
    """

    def __init__(
        self,
        message: str,
        *,
        request: httpx.Request | None = None,
        response: httpx.Response | None = None,
        status_code: int | None = None,
        code: str | None = None,
        type: str | None = None,
        param: str | None = None,
        details: Any = None,
        body: Any = None,
        retry_after: float | None = None,
    ) -> None:
        if request is None and response is not None:
            request = _request_of(response)
        super().__init__(redact(message, _bearer_of(request)))
        self.request = request
        self.response = response
        self.status_code = response.status_code if response is not None else status_code
        if response is not None:
            self.request_id = response.headers.get("x-request-id")
        self.code = code
        self.type = type
        self.param = param
        self.details = details if details is not None else {}
        self.body = body
        self.retry_after = retry_after


class APIStatusError(APIError):
    """The API answered with an error status. Subclasses name the common ones; other statuses
    raise this class itself."""


class BadRequestError(APIStatusError):
    """400: the request is malformed or a field is invalid (see ``param``)."""


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


class UnprocessableEntityError(APIStatusError):
    """422: the request was understood but cannot be carried out (vLLM refused an adapter's weights)."""


class RateLimitError(APIStatusError):
    """429: the tenant is over its per-minute limit; ``retry_after`` says when to come back."""


class InternalServerError(APIStatusError):
    """A 5xx answer: the server or one of its dependencies failed."""


class ServiceUnavailableError(InternalServerError):
    """503: a dependency (vLLM, the database) is down or too slow; ``retry_after`` when given."""


class APIConnectionError(APIError):
    """No answer: the connection was refused, failed or broke."""


class APITimeoutError(APIConnectionError):
    """No answer within the timeout."""


class APIResponseValidationError(APIError):
    """The API answered, but not in a shape the SDK can read (a body that is not JSON, a stream
    event that is not an object)."""


class StreamError(APIError):
    """A stream carried an error event after it had started (``status_code`` is the stream's HTTP
    status, 200)."""


_BY_STATUS: dict[int, type[APIStatusError]] = {
    400: BadRequestError,
    401: AuthenticationError,
    403: PermissionDeniedError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: UnprocessableEntityError,
    429: RateLimitError,
    503: ServiceUnavailableError,
}


def _request_of(response: httpx.Response) -> httpx.Request | None:
    try:
        return response.request
    except RuntimeError:  # a response built by hand has none
        return None


def status_error_class(status: int) -> type[APIStatusError]:
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    return InternalServerError if status >= 500 else APIStatusError


# The API's messages start with the field they are about: "outcome: 'maybe' is not one of ...".
_FIELD_PREFIX = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*(?:[.\[][A-Za-z0-9_\]]*)*): ")


def _param_of(error: dict[str, Any], code: str | None, message: str, details: Any) -> str | None:
    """The request field an error names: its ``param`` (the API sends it, None when no field is at
    fault); from a server without it, ``details.field``, else the first key of a per-field
    validation detail (``{"outcome": ["..."]}``), else the field the message starts with."""
    if "param" in error:
        param = error["param"]
        return str(param) if param is not None else None
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
    cls: type[APIError],
    body: Any,
    *,
    response: httpx.Response | None = None,
    status_code: int | None = None,
    retry_after: float | None = None,
) -> APIError:
    """An error of class ``cls`` built from a parsed answer body (a dict in the API's error shape,
    or anything else). ``status_code`` is for when there is no ``response`` to read it from."""
    status = response.status_code if response is not None else status_code
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        code = error.get("code")
        code = str(code) if code is not None else None
        details = error.get("details")
        message = str(error.get("message") or code or f"HTTP {status}")
        param = _param_of(error, code, message, details)
        kind = str(error["type"]) if error.get("type") is not None else None
    else:
        code, kind, details, param = None, None, None, None
        text = body if isinstance(body, str) else (json.dumps(body) if body is not None else "")
        message = text.strip()[:500] or f"HTTP {status}"
    return cls(
        message,
        response=response,
        status_code=status,
        code=code,
        type=kind,
        param=param,
        details=details,
        body=body,
        retry_after=retry_after,
    )


def error_from_response(response: httpx.Response, *, retry_after: float | None = None) -> APIStatusError:
    """The typed error for an error answer whose body has been read."""
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    error = error_from_body(status_error_class(response.status_code), body, response=response, retry_after=retry_after)
    assert isinstance(error, APIStatusError)
    return error


def error_from_transport(exc: httpx.TransportError, request: httpx.Request | None = None) -> APIConnectionError:
    if isinstance(exc, httpx.TimeoutException):
        return APITimeoutError(f"request timed out ({type(exc).__name__}): {exc}", request=request)
    return APIConnectionError(f"connection failed ({type(exc).__name__}): {exc}", request=request)
