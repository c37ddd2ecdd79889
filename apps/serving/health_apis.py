"""``GET /health/ready``: readiness for load balancers and orchestrators (``/health`` is liveness)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework.permissions import AllowAny
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.common.observability.views import is_operator_caller
from apps.serving.readiness import readiness_cached


class HealthReadyApi(APIView):
    """200 ``{"status": "ready"}`` when the database, Redis (if configured), the adapter store and at
    least one vLLM replica answer in time; else 503 ``{"status": "not_ready"}``. No key, no rate
    limit: probes call it every few seconds, and it answers from a check cached per process
    (``STROP_READY_CACHE_S``), so callers cannot make it ask the dependencies more often.

    Which checks fail, and how long each took, are for operators: shown (``checks``, ``failing``)
    only to the callers ``/metrics`` serves (the metrics token, or loopback without a proxy when no
    token is set). Left out of the OpenAPI schema, as ``/metrics`` is: it is not a tenant's."""

    authentication_classes: list[Any] = []
    permission_classes = [AllowAny]

    @extend_schema(exclude=True)
    def get(self, request: Request) -> Response:
        readiness = readiness_cached()
        status = 200 if readiness.ready else 503
        body: dict[str, Any] = {"status": "ready" if readiness.ready else "not_ready"}
        if is_operator_caller(request._request):
            if not readiness.ready:
                body["failing"] = readiness.failing
            body["checks"] = {name: check.as_dict() for name, check in readiness.checks.items()}
        return Response(body, status=status)
