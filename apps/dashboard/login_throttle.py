"""The address django-axes counts a dashboard sign-in failure against (settings: AXES_CLIENT_IP_CALLABLE)."""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest


def client_address(request: HttpRequest) -> str | None:
    """The connection's address, or behind ``STROP_TRUSTED_PROXY_HOPS`` proxies the address the
    outermost of them saw. Each proxy appends the address it was called from to X-Forwarded-For, so
    that one is the hops-th from the right; anything further left came from the client and could be
    made up. A request with fewer entries than hops did not come through the proxies: its own address."""
    hops = settings.STROP_TRUSTED_PROXY_HOPS
    if hops > 0:
        forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
        forwarded = [part for part in forwarded if part]
        if len(forwarded) >= hops:
            return forwarded[-hops]
    return request.META.get("REMOTE_ADDR")
