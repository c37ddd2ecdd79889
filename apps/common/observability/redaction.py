"""Paths as the logs may keep them: redacted by route.

Some URLs carry what must not outlive its use: an invitation token, a password-reset link's user
and token, an end user's id (which an erase removes from every table, so it must not stay in the
logs either). A matched request is logged as its route with those parameters as placeholders
(``/v1/users/{end_user_id}/opt-in``, ``/dashboard/password/reset/{uidb64}/{token}/``) and every other
parameter as sent; a request no route matched keeps only its first two segments, since nothing says
what the rest holds. The query string is never logged.
"""

from __future__ import annotations

import logging
import re

from django.http import HttpRequest

# URL parameters whose values are secrets or end-user identifiers, in any route that names them so.
REDACTED_PARAMETERS = frozenset({"token", "uidb64", "end_user_id"})
UNMATCHED_SEGMENTS = 2
_PARAMETER = re.compile(r"<(?:(?P<converter>[^>:]+):)?(?P<name>\w+)>")


def logged_path(request: HttpRequest, *, limit: int = 200) -> str:
    """``request``'s path with the values of ``REDACTED_PARAMETERS`` replaced by ``{name}``."""
    match = getattr(request, "resolver_match", None)
    if match is None:
        return _unmatched(request.path)[:limit]
    route = getattr(match, "route", "") or ""
    if route and not route.startswith("^") and "(?P<" not in route:

        def value(found: re.Match[str]) -> str:
            name = found["name"]
            return f"{{{name}}}" if name in REDACTED_PARAMETERS else str(match.kwargs.get(name, f"{{{name}}}"))

        return ("/" + _PARAMETER.sub(value, route))[:limit]
    path = request.path  # a regex route: its values, when redacted, are cut out of the path itself
    for name, raw in match.kwargs.items():
        if name in REDACTED_PARAMETERS and str(raw):
            path = path.replace(str(raw), f"{{{name}}}")
    return path[:limit]


def _unmatched(path: str) -> str:
    segments = [s for s in path.split("/") if s]
    if len(segments) <= UNMATCHED_SEGMENTS:
        return path
    return "/" + "/".join(segments[:UNMATCHED_SEGMENTS]) + "/…"


class RedactRequestPath(logging.Filter):
    """For Django's ``django.request`` logger ("Internal Server Error: <path>"): the path in the
    message, and the request attached to the record, become ``logged_path``."""

    def filter(self, record: logging.LogRecord) -> bool:
        request = getattr(record, "request", None)
        if isinstance(request, HttpRequest):
            raw, shown = request.path, logged_path(request)
            if isinstance(record.args, tuple):
                record.args = tuple(shown if arg == raw else arg for arg in record.args)
            record.request = f"{request.method} {shown}"
        return True
