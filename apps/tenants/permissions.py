from __future__ import annotations

from typing import Any

from rest_framework import exceptions, permissions
from rest_framework.request import Request

from apps.tenants.ratelimit import rate_limit_check


class HasScope(permissions.BasePermission):
    """Allows a request when its key carries the view's ``required_scope``.

    Also charges the tenant's per-minute request budget, so every authenticated API call is
    rate limited in one place.
    """

    def has_permission(self, request: Request, view: Any) -> bool:
        principal = request.user
        if principal is None or not getattr(principal, "is_authenticated", False) or not hasattr(principal, "tenant"):
            raise exceptions.NotAuthenticated("send an API key: 'Authorization: Bearer <API key>'")
        scope_of = getattr(view, "get_required_scope", None)
        required = scope_of() if scope_of is not None else getattr(view, "required_scope", "")
        if not required:
            raise exceptions.PermissionDenied("this endpoint declares no scope")
        if required != "any" and required not in principal.scopes:
            raise exceptions.PermissionDenied(f"this API key lacks the '{required}' scope")
        rate_limit_check(principal.tenant)
        return True
