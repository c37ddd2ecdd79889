from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseServerError, JsonResponse
from django.template import TemplateDoesNotExist, loader
from django.views.defaults import page_not_found
from django.views.defaults import server_error as default_server_error
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.common.exception_handler import error_body
from apps.common.exceptions import NotFound, ValidationFailed
from apps.common.observability.context import current_request_id
from apps.common.parsing import cursor_encode, end_user_id_check, header_text, query_cursor, query_int


class ScopedApi(APIView):
    """Base of tenant API views: the key must carry ``required_scope`` ("any" = any valid key)."""

    required_scope: str = ""

    @property
    def principal(self) -> Any:
        """The authenticated key's principal (``apps.tenants.authentication.ApiPrincipal``)."""
        return self.request.user

    @property
    def api_key(self) -> Any:
        """The ``ApiKey`` the request authenticated with."""
        return self.request.auth

    @property
    def tenant(self) -> Any:
        return self.principal.tenant

    @property
    def actor(self) -> str:
        return str(self.principal.actor)

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)
        # A name in the path holding NUL (%00) names nothing Postgres can store: not found, not a 500.
        for name, value in kwargs.items():
            if isinstance(value, str) and "\x00" in value:
                raise NotFound(f"{name}: nothing here is named with a NUL character")


def batch_items(data: Any) -> list[Any] | None:
    """``{"items": [...]}`` means a batch; anything else is a single item (None)."""
    if isinstance(data, dict) and "items" in data:
        if set(data) != {"items"}:
            extra = sorted(set(data) - {"items"})[0]
            raise ValidationFailed(f"{extra}: a batch body holds only 'items'", code="unknown_field")
        if not isinstance(data["items"], list):
            raise ValidationFailed("items: must be a list", code="invalid")
        return data["items"]
    return None


def batch_response(results: Sequence[Any], statuses: Sequence[str]) -> Response:
    counts = {status: 0 for status in statuses}
    for result in results:
        counts[result.status] = counts.get(result.status, 0) + 1
    return Response({**counts, "results": [r.as_dict() for r in results]}, status=207)


class HealthApi(APIView):
    """Liveness and database reachability, for load balancers and operators."""

    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]

    @extend_schema(
        responses={
            200: inline_serializer(
                name="Health", fields={"status": serializers.CharField(), "database": serializers.CharField()}
            )
        },
        auth=[],
    )
    def get(self, request: Request) -> Response:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return Response({"status": "ok", "database": connection.vendor})


def _is_api_path(path: str) -> bool:
    return path == "/v1" or path.startswith(("/v1/", "/api/"))


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """404 for a path no route matches: the API's JSON error shape under /v1/, Django's page elsewhere."""
    if _is_api_path(request.path):
        body = error_body("not_found", f"no API endpoint at {request.path}; see /api/docs/ for the API")
        return JsonResponse(body, status=404)
    return page_not_found(request, exception or Http404())


def server_error_body() -> dict[str, Any]:
    """The JSON error a 500 answers (a stream's error event too): only that the server failed and the
    request id to quote to the operator."""
    request_id = current_request_id() or ""
    message = f"the server failed; the operator's log holds the details under request id {request_id}"
    return error_body("server_error", message, {"request_id": request_id})


def server_error(request: HttpRequest) -> HttpResponse:
    """500 (already logged, with its traceback, on a line that carries the request id): the JSON
    error shape under /v1/, a page elsewhere. Either says only that the server failed and the
    request id to quote to the operator; never the error itself, a path or a host."""
    request_id = current_request_id() or ""
    if _is_api_path(request.path):
        return JsonResponse(server_error_body(), status=500)
    try:
        page = loader.get_template("500.html").render({"request_id": request_id})
    except TemplateDoesNotExist:
        return default_server_error(request)
    return HttpResponseServerError(page)


def page_link(request: Request, **params: str | None) -> str:
    """This request's URL with ``params`` set in its query (None takes one out)."""
    query = request.query_params.copy()
    for name, value in params.items():
        if value is None:
            query.pop(name, None)
        else:
            query[name] = value
    return request.build_absolute_uri(f"{request.path}?{query.urlencode()}")


def paginated(
    request: Request, queryset: Any, serialize: Any, *, default_limit: int = 50, max_limit: int = 500
) -> Response:
    """``{"count", "next", "previous", "results"}`` with strict ``limit`` / ``offset`` (a bad one is a 400)."""
    from apps.common.parsing import query_int

    limit = query_int(request.query_params, "limit", default=default_limit, minimum=1, maximum=max_limit)
    offset = query_int(request.query_params, "offset", default=0, minimum=0, maximum=10**12)
    count = queryset.count()
    page = list(queryset[offset : offset + limit])

    def link(at: int) -> str:
        return page_link(request, limit=str(limit), offset=str(at))

    return Response(
        {
            "count": count,
            "next": link(offset + limit) if offset + limit < count else None,
            "previous": link(max(0, offset - limit)) if offset > 0 else None,
            "results": serialize(page),
        }
    )


def paginated_schema(name: str, item: Any) -> Any:
    """The OpenAPI shape of :func:`paginated`'s answer."""
    from drf_spectacular.utils import inline_serializer
    from rest_framework import serializers

    return inline_serializer(
        name=name,
        fields={
            "count": serializers.IntegerField(),
            "next": serializers.URLField(allow_null=True),
            "previous": serializers.URLField(allow_null=True),
            "results": item,
        },
    )


@dataclass(frozen=True)
class KeysetRequest:
    """What a keyset-paged list was asked for: ``limit``, and either ``after`` (the position a
    ``cursor`` names) or an ``offset`` (0 with a cursor), the older clients' way."""

    limit: int
    offset: int
    after: str | None


def keyset_request(request: Request, *, default_limit: int = 50, max_limit: int = 500) -> KeysetRequest:
    """``limit`` and ``cursor`` or ``offset``, strictly (a bad one, or both of the last two, is a 400)."""
    params = request.query_params
    limit = query_int(params, "limit", default=default_limit, minimum=1, maximum=max_limit)
    offset = query_int(params, "offset", default=0, minimum=0, maximum=10**12)
    after = query_cursor(params, "cursor")
    if after is not None and "offset" in params:
        raise ValidationFailed("cursor: send a cursor or an offset, not both (a cursor's page starts after its row)")
    return KeysetRequest(limit=limit, offset=offset, after=after)


def keyset_paginated(
    request: Request, asked: KeysetRequest, *, results: Any, next_after: str | None, count: int, count_capped: bool
) -> Response:
    """:func:`paginated`'s shape for a list read by keyset, plus ``next_cursor`` (opaque: send it
    back as ``cursor``; None on the last page) and ``count_capped`` (``count`` stopped counting:
    there are more). Asked by cursor, ``next`` carries the next cursor and ``previous`` is None
    (a keyset walks forward); asked by offset, both are offset links as ever."""
    next_cursor = cursor_encode(next_after) if next_after is not None else None
    limit, offset = asked.limit, asked.offset
    if asked.after is not None:
        following = page_link(request, cursor=next_cursor) if next_cursor else None
        previous = None
    else:
        following = page_link(request, limit=str(limit), offset=str(offset + limit)) if next_cursor else None
        previous = page_link(request, limit=str(limit), offset=str(max(0, offset - limit))) if offset > 0 else None
    return Response(
        {
            "count": count,
            "count_capped": count_capped,
            "next": following,
            "previous": previous,
            "next_cursor": next_cursor,
            "results": results,
        }
    )


def keyset_paginated_schema(name: str, item: Any, **extra: Any) -> Any:
    """The OpenAPI shape of :func:`keyset_paginated`'s answer, with ``extra`` fields beside."""
    return inline_serializer(
        name=name,
        fields={
            **paginated_schema(f"{name}Base", item).fields,
            "count_capped": serializers.BooleanField(),
            "next_cursor": serializers.CharField(allow_null=True),
            **extra,
        },
    )


def end_user_of_request(request: Request, attrs: dict[str, Any]) -> tuple[str, bool | None]:
    """(end user id, consent flag or None) of a serving request: the body's ``user`` and
    ``opted_in``, else the ``X-Strop-User`` and ``X-Strop-Opt-In`` headers, which editor plugins
    can send from their configuration (Continue: ``requestOptions.headers``)."""
    field_name, user = "user", attrs.get("user") or ""
    if not user:
        field_name, user = "X-Strop-User", header_text(request.headers, "X-Strop-User")
    if user:
        end_user_id_check(user, field_name=field_name)
    flag = attrs.get("opted_in")
    if flag is None and "X-Strop-Opt-In" in request.headers:
        raw = request.headers["X-Strop-Opt-In"].strip().lower()
        if raw not in ("true", "false", "1", "0"):
            raise ValidationFailed("X-Strop-Opt-In: must be true or false")
        flag = raw in ("true", "1")
    return user, flag
