"""Around every call to vLLM from a serving endpoint (completions and chat alike): load the
version on demand when a replica lacks it, and record a failure vLLM caused."""

from __future__ import annotations

import time
from typing import Any

from django.utils import timezone

from apps.adapters.loading import adapter_version_load
from apps.adapters.models import AdapterVersion
from apps.common.exceptions import ApplicationError
from apps.engines.vllm_client import ModelNotLoaded, VLLMBadRequest
from apps.interactions.models import ServingFailure
from apps.serving.services import Route
from apps.tenants.models import Tenant


def with_load_on_demand(route: Route, call: Any) -> Any:
    """Run ``call``; if vLLM lacks the version (a restart, a new replica), load it once and retry."""
    try:
        return call()
    except ModelNotLoaded:
        if route.version is None:
            raise
        adapter_version_load(version_id=route.version.pk)
        route.version.refresh_from_db()
        if route.version.status == AdapterVersion.Status.FAILED:
            raise
        return call()


def serving_failure_record(
    tenant: Tenant, *, route: Route, user: str, error: ApplicationError, started: float, streamed: bool
) -> None:
    """A request vLLM failed (not one the client got wrong): counted in the arm's error rate."""
    if isinstance(error, VLLMBadRequest) or error.status_code < 500:
        return
    ServingFailure.objects.create(
        tenant=tenant,
        adapter=route.adapter,
        adapter_version=route.version,
        experiment=route.experiment,
        experiment_arm=route.arm,
        end_user_id=user,
        kind=error.code,
        message=error.message[:2000],
        streamed=streamed,
        occurred_at=timezone.now(),
        latency_ms=(time.perf_counter() - started) * 1000,
    )
