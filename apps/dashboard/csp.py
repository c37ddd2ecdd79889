"""The dashboard's content security policy (settings: CONTENT_SECURITY_POLICY), from django-csp."""

from __future__ import annotations

from csp.middleware import CSPMiddleware
from django.http import HttpRequest
from django.http.response import HttpResponseBase

# JSON for API clients, not pages for a browser: no policy to build (~27 µs a response on this box).
API_PREFIXES = ("/v1/", "/health", "/metrics")


class PageCSPMiddleware(CSPMiddleware):
    """django-csp's middleware for every page (dashboard, admin); the API's answers go without."""

    def process_response(self, request: HttpRequest, response: HttpResponseBase) -> HttpResponseBase:
        if request.path_info.startswith(API_PREFIXES):
            return response
        return super().process_response(request, response)
