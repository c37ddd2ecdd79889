"""Each request: an id (the caller's ``X-Request-ID`` when it is a short safe token), a count and
a duration by route and tenant, and one access log line (its path redacted by route: no token or
end-user id, ``redaction.logged_path``). No database or network call here: the ingest API is
benchmarked, and this runs on every request."""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from apps.common.observability import context, metrics
from apps.common.observability.redaction import logged_path

access_log = logging.getLogger("strop.request")

# Any other verb a client invents is counted as "other": label values must stay bounded.
_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# Probes and scrapes every few seconds would drown the access log; they log at DEBUG.
_QUIET_ROUTES = frozenset({"health", "health-ready", "metrics"})


class RequestObservabilityMiddleware:
    """First in MIDDLEWARE, so its id is on every log line of the request and its clock sees it all."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request_id = context.safe_request_id(request.META.get("HTTP_X_REQUEST_ID")) or uuid.uuid4().hex
        bound = context.bind(request_id=request_id)
        started = time.perf_counter()
        try:
            response = self.get_response(request)
            seconds = time.perf_counter() - started
            match = request.resolver_match
            route = match.view_name if match is not None else "unmatched"
            method = request.method if request.method in _METHODS else "other"
            tenant = context.current_tenant() or ""
            metrics.http_request_observed(
                route=route, method=method, status=response.status_code, tenant=tenant, seconds=seconds
            )
            response["X-Request-ID"] = request_id
            access_log.log(
                logging.DEBUG if route in _QUIET_ROUTES else logging.INFO,
                "%s %s %s %.1f ms",
                method,
                logged_path(request),
                response.status_code,
                seconds * 1000,
                extra={"route": route, "status": response.status_code, "duration_ms": round(seconds * 1000, 2)},
            )
            return response
        finally:
            context.unbind(bound)
