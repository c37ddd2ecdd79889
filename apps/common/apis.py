from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connection
from drf_spectacular.utils import extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.common.exceptions import ValidationFailed


class ScopedApi(APIView):
    """Base of tenant API views: the key must carry ``required_scope`` ("any" = any valid key)."""

    required_scope: str = ""

    @property
    def tenant(self) -> Any:
        return self.request.user.tenant

    @property
    def actor(self) -> str:
        return self.request.user.actor


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

    @extend_schema(responses={200: dict}, auth=[])
    def get(self, request: Request) -> Response:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return Response({"status": "ok", "database": connection.vendor})
