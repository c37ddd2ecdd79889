"""``GET /health/ready``: readiness for load balancers and orchestrators (``/health`` is liveness)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.serving.readiness import readiness_check


class HealthReadyApi(APIView):
    """200 ``{"status": "ready", "checks": {...}}`` when the database, Redis (if configured), the
    adapter store and at least one vLLM replica answer in time; else 503 with ``"not_ready"`` and
    the failing checks named. No key, no rate limit: probes call it every few seconds.

    Left out of the OpenAPI schema, as ``/metrics`` is: it is the operator's, not a tenant's."""

    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]

    @extend_schema(exclude=True)
    def get(self, request: Request) -> Response:
        readiness = readiness_check()
        checks = {name: check.as_dict() for name, check in readiness.checks.items()}
        if readiness.ready:
            return Response({"status": "ready", "checks": checks})
        return Response({"status": "not_ready", "failing": readiness.failing, "checks": checks}, status=503)
