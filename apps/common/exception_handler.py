"""DRF's exception handler: every error leaves as ``{"error": {"code", "message", "details"}}``."""

from __future__ import annotations

import logging
import re
from typing import Any

from django.core.exceptions import PermissionDenied
from django.db import InterfaceError, OperationalError
from django.http import Http404
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response
from rest_framework.views import set_rollback

from apps.common.exceptions import ApplicationError, RateLimited, ServiceUnavailable

logger = logging.getLogger(__name__)

# SQLSTATEs of a connection that failed or a server going away or coming back: class 08
# (connection exception), 53300 too many connections, 57P01-57P03 (shut down, crashed, starting up).
_CONNECTION_SQLSTATES = ("08", "53300", "57P01", "57P02", "57P03")
DATABASE_RETRY_AFTER_S = 2


def database_unreachable(exc: Exception) -> bool:
    """The database connection failed or broke (the server is down or restarting): the same request
    will work again shortly. An error of the statement itself (a deadlock, a timeout, a constraint)
    is not this, and stays a 500. Django closes a connection that errored and is no longer usable
    when the request ends, so the next request connects afresh."""
    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, OperationalError):
        return False
    cause = exc.__cause__
    if not hasattr(cause, "sqlstate"):  # not a Postgres error (SQLite's "database is locked")
        return False
    state = cause.sqlstate
    return state is None or state.startswith(_CONNECTION_SQLSTATES)  # None: failed on the client's side


# What a tenant must not read in an error: where things run (URLs, host:port) and where files
# live (absolute paths). The operator's log keeps the full text, under the request's id.
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s'\"<>()\[\]]*[^\s'\"<>()\[\]:.,;]")
_HOST_PORT = re.compile(r"\b(?:\d{1,3}(?:\.\d{1,3}){3}|localhost|[a-zA-Z0-9-]+(?:\.[a-zA-Z0-9-]+)+):\d{2,5}\b")
_PATH = re.compile(r"(?<![\w.~-])(?:[A-Za-z]:)?(?:[/\\][\w.~@+-]+){2,}[/\\]?")


_TRACEBACK = "Traceback (most recent call last)"


def public_text(text: str, *, max_length: int = 500, first_line: bool = True) -> str:
    """``text`` as a tenant may read it: never a traceback (its first line only, or with
    ``first_line=False`` everything before a traceback), URLs, hosts and file paths replaced by
    placeholders, at most ``max_length`` characters."""
    if first_line:
        lines = [part.strip() for part in text.splitlines() if part.strip()]
        # A bare traceback: its last line names the exception, its first says nothing.
        text = lines[-1] if lines and lines[0].startswith(_TRACEBACK) else (lines[0] if lines else "")
    else:
        text = text.split(_TRACEBACK, 1)[0].strip()
    text = _URL.sub("<url>", text)
    text = _HOST_PORT.sub("<host>", text)
    text = _PATH.sub("<path>", text)
    return text if len(text) <= max_length else text[: max_length - 1] + "…"


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details if details is not None else {}}}


def _drf_message(detail: Any) -> str:
    """A one-line message naming the first offending field of a DRF error detail."""
    if isinstance(detail, dict):
        for field, value in detail.items():
            inner = _drf_message(value)
            return inner if field == "non_field_errors" else f"{field}: {inner}"
        return "invalid input"
    if isinstance(detail, list):
        return _drf_message(detail[0]) if detail else "invalid input"
    return str(detail)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    headers: dict[str, str] = {}
    if database_unreachable(exc):
        logger.warning("the database is unreachable: %s", str(exc).strip()[:500])
        exc = ServiceUnavailable("the database is unreachable; try again shortly", retry_after_s=DATABASE_RETRY_AFTER_S)
    if isinstance(exc, ApplicationError):
        if isinstance(exc, (RateLimited, ServiceUnavailable)):
            headers["Retry-After"] = str(exc.retry_after_s)
        set_rollback()
        return Response({"error": exc.as_dict()}, status=exc.status_code, headers=headers)
    if isinstance(exc, Http404):
        exc = drf_exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = drf_exceptions.PermissionDenied()
    if isinstance(exc, drf_exceptions.APIException):
        if getattr(exc, "auth_header", None):
            headers["WWW-Authenticate"] = exc.auth_header  # type: ignore[attr-defined]
        if getattr(exc, "wait", None):
            headers["Retry-After"] = str(int(exc.wait))  # type: ignore[attr-defined]
        if isinstance(exc, drf_exceptions.ValidationError):
            body = error_body("invalid", _drf_message(exc.detail), exc.detail)
        else:
            detail = exc.detail
            code = detail.code if hasattr(detail, "code") else exc.default_code
            body = error_body(str(code), str(detail))
        set_rollback()
        return Response(body, status=exc.status_code, headers=headers)
    logger.exception("unhandled error in %s", context.get("view"))
    return None
