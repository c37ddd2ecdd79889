"""Domain code enqueues Celery tasks by name, through here, and never imports ``workers/``.

Imports run one way (workers -> apps -> gpu_trainer): a task module imports the domain function
it wraps, and domain code names the task as a string. Routing (which queue) is by name too, in
``CELERY_TASK_ROUTES``; a caller that chooses the queue per message (a tenant's training pool)
names it with ``queue=``, which wins over the route.

A message that cannot be sent (the broker is down) is logged and dropped, never raised into the
request that caused it: Postgres is the record, and the sweepers on beat send again whatever a
lost message would have done (queued runs, pending scheduling checks, adapter loads).
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

logger = logging.getLogger(__name__)


def enqueue(
    name: str, *args: Any, countdown: float | None = None, expires: float | None = None, queue: str | None = None
) -> bool:
    """Send task ``name`` with positional ``args`` now (to ``queue``, else its route's). False when
    the broker refused it."""
    from config.celery import app

    routing = {} if queue is None else {"queue": queue}  # a queue of None would not fall back to the route
    try:
        app.send_task(name, args=list(args), countdown=countdown, expires=expires, **routing)
    except Exception:  # kombu raises its own and the transport's errors; none may fail the caller
        logger.exception("could not enqueue %s%r; a sweeper will recover the work", name, tuple(args))
        return False
    return True


def enqueue_on_commit(
    name: str, *args: Any, countdown: float | None = None, expires: float | None = None, queue: str | None = None
) -> None:
    """Send task ``name`` once the current transaction commits (at once outside a transaction)."""
    transaction.on_commit(lambda: enqueue(name, *args, countdown=countdown, expires=expires, queue=queue))
