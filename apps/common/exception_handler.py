"""DRF's exception handler: every error leaves as OpenAI's error object with Strop's details,
``{"error": {"message", "type", "param", "code", "details"}}`` (see :mod:`apps.common.exceptions`)."""

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

from apps.common.exceptions import ERROR_CODES, ApplicationError, RateLimited, ServiceUnavailable, error_object

logger = logging.getLogger(__name__)

# SQLSTATEs of a connection that failed or a server going away or coming back: class 08
# (connection exception), 53300 too many connections, 57P01-57P03 (shut down, crashed, starting up).
_CONNECTION_SQLSTATES = ("08", "53300", "57P01", "57P02", "57P03")
DATABASE_RETRY_AFTER_S = 2
# SQLSTATEs of a transaction the database rolled back against a concurrent one: 40P01 (a deadlock:
# each waited for the other's rows) and 40001 (a serialization failure).
_CONCURRENCY_SQLSTATES = ("40P01", "40001")
CONCURRENCY_RETRY_AFTER_S = 1


def _sqlstate(exc: Exception) -> tuple[bool, str | None]:
    """(whether ``exc`` is a Postgres error, its SQLSTATE: None when it failed on the client's side)."""
    cause: Any = exc.__cause__
    if not hasattr(cause, "sqlstate"):  # not a Postgres error (SQLite's "database is locked")
        return False, None
    return True, cause.sqlstate


def database_unreachable(exc: Exception) -> bool:
    """The database connection failed or broke (the server is down or restarting): the same request
    will work again shortly. An error of the statement itself (a timeout, a constraint) is not this,
    and stays a 500. Django closes a connection that errored and is no longer usable when the request
    ends, so the next request connects afresh."""
    if isinstance(exc, InterfaceError):
        return True
    if not isinstance(exc, OperationalError):
        return False
    postgres, state = _sqlstate(exc)
    return postgres and (state is None or state.startswith(_CONNECTION_SQLSTATES))


def database_concurrency(exc: Exception) -> bool:
    """The database rolled the request's transaction back against a concurrent one (a deadlock): the
    same request, sent again, finds the other one done. Retried within the request, it would hold its
    worker and connection while the client (the SDK retries a 503 after its ``Retry-After``) can."""
    if not isinstance(exc, OperationalError):
        return False
    _, state = _sqlstate(exc)
    return state in _CONCURRENCY_SQLSTATES


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


def error_body(code: str, message: str, details: Any = None, *, param: str | None = None) -> dict[str, Any]:
    """The answer's body for an error raised outside DRF (middleware, Django's handlers); ``code``
    is one of ERROR_CODES, whose status gives the ``type``."""
    return {"error": error_object(code, message, status=ERROR_CODES[code].status, param=param, details=details)}


# DRF's codes for the kinds of mistake that ours name otherwise.
_DRF_CODES = {"parse_error": "malformed_json", "throttled": "rate_limited"}
# A validation error's code: the kind of mistake; every other DRF code (min_value, blank, null...)
# is a wrong value.
_VALIDATION_CODES = frozenset({"required", "unknown_field"})
_LIMIT = re.compile(r"(-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\.?$")


def _first_error(detail: Any, path: tuple[str, ...] = ()) -> tuple[tuple[str, ...], Any]:
    """The path and leaf (an ErrorDetail) of the first error in a DRF validation detail. A list of
    objects is per item (``{}`` for a valid one), so its index is part of the path; a list of
    strings is the errors of one field."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            if value:
                return _first_error(value, path if key == "non_field_errors" else (*path, str(key)))
        return path, "invalid input"
    if isinstance(detail, list):
        for index, value in enumerate(detail):
            if isinstance(value, (dict, list)):
                if value:
                    return _first_error(value, (*path, str(index)))
            else:
                return path, value
        return path, "invalid input"
    return path, detail


def _sent_value(request: Any, path: tuple[str, ...]) -> Any:
    """The value the request sent at ``path`` of its JSON body, or None."""
    try:
        value = request.data if request is not None else None
    except Exception:  # noqa: BLE001 - the body could not be parsed: there is no value to quote
        return None
    for key in path:
        if isinstance(value, dict):
            value = value.get(key)
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            return None
    return value


def _validation_error(detail: Any, request: Any) -> dict[str, Any]:
    """The error object of a DRF validation error: the first offending field's path as ``param``
    (``messages.0.content``), its kind as ``code``, and a message in plain words."""
    path, leaf = _first_error(detail)
    param = ".".join(path) or None
    drf_code = str(getattr(leaf, "code", "invalid"))
    text = str(leaf)
    limit = _LIMIT.search(text)
    sent = _sent_value(request, path) if drf_code in ("min_value", "max_value") else None
    if drf_code == "required":
        text = "is required"
    elif drf_code in ("min_value", "max_value") and limit and isinstance(sent, (int, float)):
        text = f"must be {'at least' if drf_code == 'min_value' else 'at most'} {limit.group(1)} (got {sent})"
    elif drf_code == "null":
        text = "must not be null"
    message = f"{param}: {text}" if param else text
    code = drf_code if drf_code in _VALIDATION_CODES else "invalid"
    return error_object(code, message, status=400, param=param, details=detail)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    headers: dict[str, str] = {}
    if database_unreachable(exc):
        logger.warning("the database is unreachable: %s", str(exc).strip()[:500])
        exc = ServiceUnavailable("the database is unreachable; try again shortly", retry_after_s=DATABASE_RETRY_AFTER_S)
    elif database_concurrency(exc):
        logger.warning("the database aborted a request against a concurrent one: %s", str(exc).strip()[:500])
        exc = ServiceUnavailable(
            "the database aborted this request against a concurrent one (a deadlock); send it again",
            retry_after_s=CONCURRENCY_RETRY_AFTER_S,
        )
    if isinstance(exc, ApplicationError):
        if isinstance(exc, (RateLimited, ServiceUnavailable)):
            if exc.retry_after_s is None:
                headers["x-should-retry"] = "false"
            else:
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
            body = {"error": _validation_error(exc.detail, context.get("request"))}
        else:
            detail = exc.detail
            code = str(detail.code if hasattr(detail, "code") else exc.default_code)
            code = _DRF_CODES.get(code, code)
            body = {"error": error_object(code, str(detail), status=exc.status_code, param=None, details=None)}
        set_rollback()
        return Response(body, status=exc.status_code, headers=headers)
    logger.exception("unhandled error in %s", context.get("view"))
    return None
