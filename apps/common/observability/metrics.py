"""The counters and histograms Strop's processes update, and the exposition ``GET /metrics`` serves.

prometheus_client's multiprocess mode: every process (each gunicorn worker, each Celery worker
and pool process) writes its values to its own files under ``PROMETHEUS_MULTIPROC_DIR``, and a
scrape adds up the files of every process, so a counter is the platform's total whichever
process answers the scrape. The settings export that variable (default ``var/prometheus``)
before this module is first imported; prometheus_client picks its storage at import.

Label values are bounded: routes are URL pattern names, never raw paths; tenants are slugs;
reasons, outcomes, stages and task names come from code, never from a request.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping
from typing import Protocol

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

# registry=None: these are only written here; the scrape reads them back from the files.
HTTP_REQUESTS = Counter(
    "strop_http_requests",
    "HTTP requests answered, by route (URL pattern name), method, status code and tenant slug",
    ["route", "method", "status", "tenant"],
    registry=None,
)
HTTP_DURATION = Histogram(
    "strop_http_request_duration_seconds",
    "Time from the request reaching Django to its response, by route and method",
    ["route", "method"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
    registry=None,
)
INGEST_ACCEPTED = Counter(
    "strop_ingest_accepted",
    "Ingested items stored (interactions created; feedback recorded or kept pending), by kind and tenant",
    ["kind", "tenant"],
    registry=None,
)
INGEST_DUPLICATES = Counter(
    "strop_ingest_duplicates",
    "Ingested items that repeated a client_id already stored (nothing new written), by kind and tenant",
    ["kind", "tenant"],
    registry=None,
)
INGEST_REJECTED = Counter(
    "strop_ingest_rejected",
    "Ingested items refused, by kind and reason code (the item error's code)",
    ["kind", "reason"],
    registry=None,
)
RETENTION_DELETED = Counter(
    "strop_retention_deleted",
    "Rows deleted by the retention pass (older than the tenant's retention), by kind and tenant",
    ["kind", "tenant"],
    registry=None,
)
CELERY_TASKS = Counter(
    "strop_celery_tasks",
    "Celery task executions by task name and outcome (succeeded, failed, retried, revoked)",
    ["task", "outcome"],
    registry=None,
)
ADAPTER_LOADS = Counter(
    "strop_adapter_loads",
    "Adapter version loads into vLLM by outcome (loaded, rejected, unavailable, error)",
    ["outcome"],
    registry=None,
)
READINESS_CHECKS = Counter(
    "strop_readiness_checks",
    "Readiness checks run (each asks every dependency); GET /health/ready answers from the last one for a few seconds",
    registry=None,
)
TRAINING_STAGE = Histogram(
    "strop_training_stage_seconds",
    "Duration of each stage (export, train, gate, load) of finished training runs",
    ["stage"],
    buckets=(0.1, 1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 4 * 3600.0),
    registry=None,
)


class ItemVerdict(Protocol):
    """What the ingest services answer per item (``apps.interactions.services.ItemResult``)."""

    @property
    def status(self) -> str: ...

    @property
    def error(self) -> Mapping[str, str] | None: ...


def http_request_observed(*, route: str, method: str, status: int, tenant: str, seconds: float) -> None:
    HTTP_REQUESTS.labels(route, method, str(status), tenant).inc()
    HTTP_DURATION.labels(route, method).observe(seconds)


def ingest_counted(kind: str, tenant: str, results: Iterable[ItemVerdict]) -> None:
    """Count one ingest call's verdicts: ``kind`` is "interactions" or "feedback"."""
    accepted = duplicates = 0
    rejected: dict[str, int] = {}
    for result in results:
        if result.status == "rejected":
            reason = (result.error or {}).get("code", "invalid")
            rejected[reason] = rejected.get(reason, 0) + 1
        elif result.status == "duplicate":
            duplicates += 1
        else:
            accepted += 1
    if accepted:
        INGEST_ACCEPTED.labels(kind, tenant).inc(accepted)
    if duplicates:
        INGEST_DUPLICATES.labels(kind, tenant).inc(duplicates)
    for reason, count in rejected.items():
        INGEST_REJECTED.labels(kind, reason).inc(count)


def retention_counted(tenant: str, deleted: Mapping[str, int]) -> None:
    for kind, count in deleted.items():
        if count:
            RETENTION_DELETED.labels(kind, tenant).inc(count)


def adapter_load_counted(outcome: str) -> None:
    ADAPTER_LOADS.labels(outcome).inc()


def readiness_checked() -> None:
    READINESS_CHECKS.inc()


def training_run_finished(stage_seconds: Mapping[str, float]) -> None:
    """Observe the stages a run went through, once, when it ends (candidate, rejected or failed)."""
    for stage, seconds in stage_seconds.items():
        TRAINING_STAGE.labels(stage).observe(seconds)


def celery_task_counted(task: str, outcome: str) -> None:
    CELERY_TASKS.labels(task, outcome).inc()


def process_dead(pid: int) -> None:
    """Bookkeeping when a process that wrote metrics exits (gunicorn worker, Celery pool process):
    drops its files for live gauges; its counters stay in the totals."""
    mark_process_dead(pid)


@functools.cache
def _registry() -> CollectorRegistry:
    # The collectors read the domain apps, which import this module to count: import them late.
    from apps.common.observability.collectors import StropCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=os.environ["PROMETHEUS_MULTIPROC_DIR"])
    registry.register(StropCollector())
    return registry


def exposition() -> tuple[bytes, str]:
    """Every process's counters added up, plus the values read at scrape time; and the content type."""
    return generate_latest(_registry()), CONTENT_TYPE_LATEST
