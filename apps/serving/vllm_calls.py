"""Around every call to vLLM from a serving endpoint (completions and chat alike): load the
version on demand when a replica lacks it, count the wait as vLLM's, and record a failure vLLM
caused (synchronous: awaited through :func:`apps.serving.sync_work.in_db_thread`)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from django.utils import timezone

from apps.adapters.loading import adapter_version_load
from apps.adapters.models import AdapterVersion
from apps.common.exceptions import ApplicationError, ServerBusy
from apps.engines.vllm_client import ModelNotLoaded, VLLMBadRequest
from apps.interactions.models import ServingFailure
from apps.interactions.stream_parts import stream_parts_discard
from apps.serving.services import Route, experiment_stop_on_failed_version
from apps.tenants.models import Tenant

T = TypeVar("T")


class UpstreamPlan(Protocol):
    """What :func:`vllm_answer` reads and counts of a plan (``CompletionPlan``, ``ChatPlan``)."""

    tenant: Tenant
    route: Route
    upstream_s: float  # the time spent waiting on vLLM so far: what X-Strop-Overhead-Ms leaves out

    @property
    def request(self) -> Any: ...  # its ``user``: the end user a failure is recorded for


async def vllm_answer(plan: UpstreamPlan, call: Callable[[], Awaitable[T]], *, started: float) -> T:
    """vLLM's answer to ``call()`` (a whole completion, or a stream opened), the version loaded on
    demand (:func:`with_load_on_demand`). The wait, from ``started``, counts in ``plan.upstream_s``
    whether vLLM answers or fails: a request vLLM kept waiting and then failed spent that time on
    vLLM, not in Strop. A failure is recorded (:func:`serving_failure_recorded`) and raised."""
    try:
        try:
            return await with_load_on_demand(plan.tenant, plan.route, call)
        finally:
            plan.upstream_s += time.perf_counter() - started
    except ApplicationError as exc:
        user = plan.request.user
        await serving_failure_recorded(plan.tenant, route=plan.route, user=user, error=exc, started=started)
        raise


async def with_load_on_demand(tenant: Tenant, route: Route, call: Callable[[], Awaitable[T]]) -> T:
    """Await ``call()``; if vLLM lacks the version (a restart, a new replica), load it once (on a
    serving database thread) and retry."""
    from apps.serving.sync_work import in_db_thread

    try:
        return await call()
    except ModelNotLoaded:
        if route.version is None:
            raise
        if not await in_db_thread(_version_loaded, tenant, route):
            raise
        return await call()


def _version_loaded(tenant: Tenant, route: Route) -> bool:
    """Load the route's version into vLLM; whether it is served now (False: the load failed, and the
    version with it: the request is answered vLLM's 404, and the next ones are routed elsewhere,
    ``apps.serving.services.serving_route``; an experiment it was an arm of is stopped now)."""
    assert route.version is not None
    adapter_version_load(version_id=route.version.pk)
    route.version.refresh_from_db()
    if route.version.status != AdapterVersion.Status.FAILED:
        return True
    if route.experiment is not None:
        experiment_stop_on_failed_version(tenant, experiment=route.experiment, version=route.version)
    return False


def serving_failure_record(
    tenant: Tenant,
    *,
    route: Route,
    user: str,
    error: ApplicationError,
    started: float,
    streamed: bool,
    stream_parts: Sequence[uuid.UUID] | None = None,
) -> None:
    """A request vLLM failed (not one the client got wrong, nor one this process was too busy to
    send: ``server_busy`` says nothing of the version): counted in the arm's error rate.
    ``stream_parts``: the interaction ids of a stream that wrote parts as it went; they are dropped
    (a failed stream is a failure, never half an interaction), the feedback on them kept."""
    if stream_parts:
        stream_parts_discard(tenant, ids=stream_parts)
    if isinstance(error, (VLLMBadRequest, ServerBusy)) or error.status_code < 500:
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
        stream_ids=[str(i) for i in stream_parts or ()],
        occurred_at=timezone.now(),
        latency_ms=(time.perf_counter() - started) * 1000,
    )


async def serving_failure_recorded(
    tenant: Tenant, *, route: Route, user: str, error: ApplicationError, started: float
) -> None:
    """:func:`serving_failure_record` for a request vLLM failed before its answer began, on a
    serving database thread; shielded, so a client that left meanwhile (the awaiting task
    cancelled) still has the failure recorded."""
    from apps.serving.sync_work import in_db_thread

    failure = asyncio.ensure_future(
        in_db_thread(
            serving_failure_record, tenant, route=route, user=user, error=error, started=started, streamed=False
        )
    )
    await asyncio.shield(failure)
