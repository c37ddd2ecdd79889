from __future__ import annotations

from typing import Any

from rest_framework import exceptions, permissions
from rest_framework.request import Request

from apps.tenants.ratelimit import batch_units, rate_limit_check


def batch_size(request: Request) -> int:
    """The items of a call to a batch endpoint: those of ``{"items": [...]}`` (a CSV import parses
    to the same), one for anything else. Declared on a view as ``rate_items = staticmethod(batch_size)``;
    the call then costs ``batch_units`` of it. Reading ``request.data`` parses the body."""
    if request.method != "POST":
        return 1
    data = request.data
    items = data.get("items") if isinstance(data, dict) else None
    return max(1, len(items)) if isinstance(items, list) else 1


EDITOR_SCOPE = "editor"


def acts_as_editor(principal: Any, required: str) -> bool:
    """Whether a key reaches a view needing ``required`` only through the ``editor`` scope: then
    it serves completions without giving consent, and sends feedback only on what it served."""
    scopes: frozenset[str] = getattr(principal, "scopes", frozenset())
    return required not in scopes and EDITOR_SCOPE in scopes


class HasScope(permissions.BasePermission):
    """Allows a request when its key carries the view's ``required_scope``, or the ``editor`` scope
    on a view that declares ``editor_allowed`` (completions, feedback, editor outcomes: the view
    then applies the editor's limits, see ``acts_as_editor``).

    Also charges the tenant's per-minute budget, so every authenticated API call is rate limited in
    one place: one unit before the body is read (a flood of requests is refused unparsed), then,
    for a view that declares ``rate_items(request) -> int``, the rest of its cost once the body is
    parsed and before the view does any work with it.
    """

    def has_permission(self, request: Request, view: Any) -> bool:
        principal: Any = request.user
        if principal is None or not getattr(principal, "is_authenticated", False) or not hasattr(principal, "tenant"):
            raise exceptions.NotAuthenticated("send an API key: 'Authorization: Bearer <API key>'")
        scope_of = getattr(view, "get_required_scope", None)
        required = scope_of() if scope_of is not None else getattr(view, "required_scope", "")
        if not required:
            raise exceptions.PermissionDenied("this endpoint declares no scope")
        editor_may = getattr(view, "editor_allowed", False) and EDITOR_SCOPE in principal.scopes
        if required != "any" and required not in principal.scopes and not editor_may:
            raise exceptions.PermissionDenied(f"this API key lacks the '{required}' scope")
        rate_limit_check(principal.tenant)
        size_of = getattr(view, "rate_items", None)
        if size_of is not None:
            items = size_of(request)
            units = batch_units(items)
            if units > 1:
                rate_limit_check(principal.tenant, cost=units - 1, batch=(items, units))
        return True
