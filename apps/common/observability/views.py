"""``GET /metrics``: for operators only.

With ``STROP_METRICS_TOKEN`` set, the caller must send ``Authorization: Bearer <token>``. Without
it, only a loopback caller that came through no proxy is served: a reverse proxy on the same
host connects from loopback too, so a forwarded request is refused (set the token, or scrape the
API's own port from the host).
"""

from __future__ import annotations

import hmac
import ipaddress

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from apps.common.exception_handler import error_body
from apps.common.observability import metrics

_PROXY_HEADERS = ("HTTP_X_FORWARDED_FOR", "HTTP_FORWARDED", "HTTP_X_REAL_IP")


def _is_direct_loopback(request: HttpRequest) -> bool:
    if any(header in request.META for header in _PROXY_HEADERS):
        return False
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def _sent_metrics_token(request: HttpRequest, token: str) -> bool:
    scheme, _, sent = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(sent.strip().encode(), token.encode())


def is_operator_caller(request: HttpRequest) -> bool:
    """Whether the caller may read what is for operators only (``/metrics``, the details of
    ``/health/ready``): with ``STROP_METRICS_TOKEN`` set, a caller that sends it; without, a
    loopback caller that came through no proxy."""
    token: str = settings.STROP_METRICS_TOKEN
    return _sent_metrics_token(request, token) if token else _is_direct_loopback(request)


def _refusal(request: HttpRequest) -> JsonResponse | None:
    if is_operator_caller(request):
        return None
    if settings.STROP_METRICS_TOKEN:
        response = JsonResponse(
            error_body("not_authenticated", "send the metrics token: 'Authorization: Bearer <STROP_METRICS_TOKEN>'"),
            status=401,
        )
        response["WWW-Authenticate"] = 'Bearer realm="strop-metrics"'
        return response
    return JsonResponse(
        error_body(
            "permission_denied",
            "metrics are served to loopback callers only; set STROP_METRICS_TOKEN to scrape from elsewhere",
        ),
        status=403,
    )


@csrf_exempt  # no session, no form: any other method gets our 405, not a CSRF page
def metrics_view(request: HttpRequest) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        response = JsonResponse(error_body("method_not_allowed", f"method {request.method} is not allowed"), status=405)
        response["Allow"] = "GET, HEAD"
        return response
    refusal = _refusal(request)
    if refusal is not None:
        return refusal
    body, content_type = metrics.exposition()
    return HttpResponse(body, content_type=content_type)
