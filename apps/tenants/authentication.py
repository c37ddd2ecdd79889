from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions
from rest_framework.request import Request

from apps.common.observability.context import bind_tenant
from apps.tenants.keys import key_matches, parse_key
from apps.tenants.models import ApiKey, Tenant
from apps.tenants.selectors import api_key_find_with
from apps.tenants.services import api_key_touch


@dataclass
class ApiPrincipal:
    """``request.user`` for API-key requests: the tenant and what the key may do."""

    tenant: Tenant
    api_key: ApiKey
    scopes: frozenset[str] = field(default_factory=frozenset)
    is_authenticated: bool = True
    is_anonymous: bool = False

    @property
    def actor(self) -> str:
        return f"key:{self.api_key.prefix}"


class ApiKeyAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer strop_<prefix>_<secret>``."""

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[ApiPrincipal, ApiKey] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        keyword, _, raw = header.partition(" ")
        if keyword.lower() != self.keyword.lower() or not raw.strip():
            raise exceptions.AuthenticationFailed("Authorization header must be 'Bearer <API key>'")
        parsed = parse_key(raw.strip())
        if parsed is None:
            raise exceptions.AuthenticationFailed("invalid API key")
        # A view that knows what it reads next has it read in the key's round trip (serving).
        view = (getattr(request, "parser_context", None) or {}).get("view")
        ahead = view.read_ahead(request) if view is not None and hasattr(view, "read_ahead") else None
        api_key, rows = api_key_find_with(prefix=parsed.prefix, also=ahead.reads(parsed.prefix) if ahead else [])
        if api_key is None or not key_matches(parsed.raw, api_key.key_hash):
            raise exceptions.AuthenticationFailed("invalid API key")
        if not api_key.is_active:
            raise exceptions.AuthenticationFailed("this API key was revoked")
        if ahead is not None:  # the key is valid: what was read with it is its tenant's to use
            ahead.rows, ahead.tenant_id = rows, api_key.tenant_id
        api_key_touch(api_key=api_key, resolution_s=settings.STROP_KEY_LAST_USED_RESOLUTION_S)
        principal = ApiPrincipal(tenant=api_key.tenant, api_key=api_key, scopes=frozenset(api_key.scopes))
        bind_tenant(api_key.tenant.slug)  # for this request's log lines and metrics
        return principal, api_key

    def authenticate_header(self, request: Any) -> str:
        return 'Bearer realm="strop"'


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    """The API key in the OpenAPI schema: ``Authorization: Bearer strop_…``."""

    target_class = "apps.tenants.authentication.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "strop_… API key"}
