"""Strop's routes plus the bare baseline view (see bare_settings.py)."""

from __future__ import annotations

import os

import orjson
from django.http import HttpRequest, JsonResponse
from django.urls import path
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from apps.common.lookups import prepared_cursor
from apps.interactions.rows import feedback_upsert_sql
from config.urls import urlpatterns as strop_urlpatterns

_TENANT_ID = int(os.environ.get("BENCH_BARE_TENANT_ID", "0"))


@csrf_exempt
def bare_feedback(request: HttpRequest) -> JsonResponse:
    body = orjson.loads(request.body)
    now = timezone.now()
    with prepared_cursor() as cursor:  # the server setup Strop's statements get
        params = (_TENANT_ID, None, "bare-" + body["client_id"], body["outcome"], "", None, now, now, now, 1, "{}")
        cursor.execute(feedback_upsert_sql("pending_client_id"), params)
    return JsonResponse({"status": "pending", "client_id": body["client_id"]})


urlpatterns = [*strop_urlpatterns, path("bench/bare-feedback", bare_feedback)]
