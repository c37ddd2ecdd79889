"""Celery's side: the request id travels with every task sent and is restored in the worker;
task outcomes are counted; each worker is seen alive at its heartbeat (``last_seen``); worker and
beat logs use Strop's formatter.

Imported by ``config/celery.py``, before Django's settings are loaded, so the metrics module
(which loads prometheus_client) is imported inside the handlers, never here.
"""

from __future__ import annotations

import logging.config
import os
from typing import Any

from celery import signals

from apps.common.observability import context

REQUEST_ID_HEADER = "strop_request_id"
TENANT_HEADER = "strop_tenant"

# Task id -> what its prerun bound, reset by its postrun (a thread pool runs many tasks per thread).
_bound: dict[str, context.Bound] = {}


@signals.before_task_publish.connect
def attach_request_context(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """A task sent while handling a request (or inside a task that one caused) carries its id."""
    request_id = context.current_request_id()
    if headers is None or request_id is None:
        return
    headers[REQUEST_ID_HEADER] = request_id
    tenant = context.current_tenant()
    if tenant is not None:
        headers[TENANT_HEADER] = tenant


@signals.task_prerun.connect
def restore_request_context(task_id: str = "", task: Any = None, **_: Any) -> None:
    request = getattr(task, "request", None)
    # An eager task runs inside the request that sent it and has no headers: it keeps its context.
    request_id = context.safe_request_id(getattr(request, REQUEST_ID_HEADER, None)) or context.current_request_id()
    tenant = getattr(request, TENANT_HEADER, None)
    tenant = tenant if isinstance(tenant, str) and tenant else context.current_tenant()
    _bound[task_id] = context.bind(request_id=request_id, tenant=tenant, task=(getattr(task, "name", "?"), task_id))


@signals.task_postrun.connect
def clear_request_context(task_id: str = "", **_: Any) -> None:
    bound = _bound.pop(task_id, None)
    if bound is not None:
        context.unbind(bound)


def _count(task: Any, outcome: str) -> None:
    from apps.common.observability.metrics import celery_task_counted

    celery_task_counted(getattr(task, "name", None) or "unknown", outcome)


@signals.task_success.connect
def count_success(sender: Any = None, **_: Any) -> None:
    _count(sender, "succeeded")


@signals.task_failure.connect
def count_failure(sender: Any = None, **_: Any) -> None:
    _count(sender, "failed")


@signals.task_retry.connect
def count_retry(sender: Any = None, **_: Any) -> None:
    _count(sender, "retried")


@signals.task_revoked.connect
def count_revoked(sender: Any = None, **_: Any) -> None:
    _count(sender, "revoked")  # revoked by an operator, or expired before a worker took it


@signals.worker_process_shutdown.connect
def prefork_child_exits(**_: Any) -> None:
    from apps.common.observability.metrics import process_dead

    process_dead(os.getpid())


@signals.worker_shutdown.connect
def worker_exits(**_: Any) -> None:
    from apps.common.observability.metrics import process_dead

    process_dead(os.getpid())


# What /metrics calls this worker process ("worker-" and the queues it takes), set at its start.
_worker_role: str | None = None


def worker_role(queues: Any) -> str:
    """``worker-gpu``, ``worker-default,serving``, ``worker-gpu-pool-a``: the queues a worker takes."""
    return "worker-" + ",".join(sorted(str(queue) for queue in queues or ())) if queues else "worker"


@signals.worker_init.connect
def note_worker_role(sender: Any = None, **_: Any) -> None:
    global _worker_role
    selected = getattr(getattr(getattr(sender, "app", None), "amqp", None), "queues", None)
    _worker_role = worker_role(getattr(selected, "consume_from", None))


@signals.heartbeat_sent.connect
def worker_seen(sender: Any = None, **_: Any) -> None:
    """At each of the worker's event heartbeats (every 2 s unless started --without-heartbeat);
    written at most every few seconds."""
    from apps.common.observability.last_seen import process_seen

    hostname = getattr(getattr(sender, "eventer", None), "hostname", None)
    if hostname:
        process_seen(_worker_role or "worker", str(hostname))


@signals.worker_shutdown.connect
def worker_gone(sender: Any = None, **_: Any) -> None:
    from apps.common.observability.last_seen import process_gone

    hostname = getattr(sender, "hostname", None)
    if hostname and _worker_role is not None:
        process_gone(_worker_role, str(hostname))


@signals.setup_logging.connect
def use_strop_logging(loglevel: int | str | None = None, **_: Any) -> None:
    """Workers and beat log like the API (LOG_FORMAT); Celery's ``-l`` still sets the level.

    Connecting this signal also stops Celery from replacing the root logger's handlers."""
    from django.conf import settings

    logging.config.dictConfig(settings.LOGGING)
    if loglevel:
        logging.getLogger().setLevel(loglevel)
