"""One error shape for the whole API: ``{"error": {"code", "message", "details"}}``.

Domain code raises subclasses of :class:`ApplicationError`;
:func:`apps.common.exception_handler.exception_handler` (wired into DRF) turns them, and DRF's
own exceptions, into that shape with the right status. Anything else is a 500 that is logged.
"""

from __future__ import annotations

from typing import Any


class ApplicationError(Exception):
    """Base of every error the API answers on purpose."""

    status_code = 400
    code = "bad_request"

    def __init__(self, message: str, *, details: Any = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.details = details if details is not None else {}
        if code is not None:
            self.code = code

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


class ValidationFailed(ApplicationError):
    status_code = 400
    code = "invalid"


class NotFound(ApplicationError):
    status_code = 404
    code = "not_found"


class Forbidden(ApplicationError):
    status_code = 403
    code = "forbidden"


class Conflict(ApplicationError):
    status_code = 409
    code = "conflict"


class PayloadTooLarge(ApplicationError):
    status_code = 413
    code = "payload_too_large"


class RateLimited(ApplicationError):
    status_code = 429
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after_s: int, details: Any = None) -> None:
        super().__init__(message, details=details)
        self.retry_after_s = retry_after_s


class ServiceUnavailable(ApplicationError):
    """A dependency (vLLM, the database) is down or too slow; the client may retry later."""

    status_code = 503
    code = "service_unavailable"

    def __init__(self, message: str, *, retry_after_s: int = 5, details: Any = None) -> None:
        super().__init__(message, details=details)
        self.retry_after_s = retry_after_s
