"""New labelled events may be enough for a training run: ask the training scheduler, by its
task's name, to check the tenant shortly. The interactions app calls this once feedback
committed; the scheduler (``apps.training.services.training_schedule_tenant``) clears the key
below before it counts.
"""

from __future__ import annotations

import logging
import time

from apps.common.cache import cache_add_or_get
from apps.common.tasks import enqueue

logger = logging.getLogger(__name__)

# A burst of feedback asks for one scheduling check, run a moment after the burst (trailing
# edge): the key is set by the first event and cleared by the check itself before it counts, so
# every event is seen by a check that starts after it committed, without waiting for beat.
SCHEDULE_CHECK_DELAY_S = 0.5
SCHEDULE_CHECK_KEY_TIMEOUT_S = 10  # a lost message blocks checks this long at most (beat covers it)
# Until a pending check can start, an event that commits is one it will count, so a process that
# knows when the pending check is due does not ask Redis again (one round trip fewer on most
# feedback requests). The key holds that time: the asking process's wall clock plus the delay, a
# lower bound for the check's start, since Celery runs it once the worker's wall clock reaches the
# send time (later still) plus the delay. The process that set the key and every process that found
# it set trust it until a fifth of the delay (0.1 s) before that time (a found time no later than
# its own ask's would be), room for a worker clock that runs ahead. One further ahead than that
# can start the check inside the window: an event then left uncounted waits for the next check, at
# the latest beat's (training_schedule_all, every 15 s).
SCHEDULE_CHECK_TRUSTED_FRACTION = 0.8
_check_asked_until: dict[int, float] = {}  # tenant id -> wall-clock time (one entry per tenant)


def schedule_check_key(tenant_id: int) -> str:
    return f"strop:schedule-check:{tenant_id}"


def training_check_soon(tenant_id: int) -> None:
    """New labelled events may be enough for a run: check the tenant's adapters shortly.

    Runs after the feedback committed, so it must not fail the request: with the cache (Redis)
    down, no check is asked for, and beat's ``training_schedule_all`` finds the run due."""
    asked = time.time()
    if asked < _check_asked_until.get(tenant_id, 0.0):
        return  # the pending check has not started: it will count this event
    due_ms = int((asked + SCHEDULE_CHECK_DELAY_S) * 1000)
    try:
        pending_due_ms = cache_add_or_get(schedule_check_key(tenant_id), due_ms, timeout_s=SCHEDULE_CHECK_KEY_TIMEOUT_S)
    except Exception as exc:  # the cache backend's own errors (redis, files); none may fail the caller
        logger.warning("no scheduling check for tenant %s (the cache failed: %s); beat will check", tenant_id, exc)
        return
    margin_s = SCHEDULE_CHECK_DELAY_S * (1 - SCHEDULE_CHECK_TRUSTED_FRACTION)
    if pending_due_ms is not None:  # another ask's check is pending, due then (a key left by a lost one: in the past)
        # Never trusted longer than this process's own ask would be: a clock far ahead stays harmless.
        _check_asked_until[tenant_id] = min(pending_due_ms, due_ms) / 1000 - margin_s
    elif enqueue("workers.training.training_schedule_tenant", tenant_id, countdown=SCHEDULE_CHECK_DELAY_S, expires=60):
        _check_asked_until[tenant_id] = due_ms / 1000 - margin_s
