"""A debounced task: a burst of asks sends one message, a moment after the burst's first ask.

The asker names the task and its subject (``debounced_enqueue(task, subject)``); the task clears
the debounce when it starts (``debounce_clear(task, subject)``), before it reads anything, so every
ask that commits after that start is seen by a later run: the first ask after it sends again. The
key is named by the task, so the app that asks and the worker that runs need not import each other
(the interactions app asks the training scheduler to check a tenant this way).

Until a pending run can start, an ask is one it will see, so a process that knows when that run is
due does not ask Redis again (one round trip fewer on most asks). The key holds that time: the
asking process's wall clock plus the delay, a lower bound for the run's start, since Celery runs it
once the worker's wall clock reaches the send time (later still) plus the delay. The process that
set the key and every process that found it set trust it until a fifth of the delay before that time
(a found time no later than its own ask's would be), room for a worker clock that runs ahead. One
further ahead than that can start the run inside the window: an ask then left unseen waits for the
next run, at the latest the periodic sweep the caller must have (beat) for lost messages.
"""

from __future__ import annotations

import logging
import time

from django.core.cache import cache

from apps.common.cache import cache_add_or_get
from apps.common.tasks import enqueue

logger = logging.getLogger(__name__)

DEBOUNCE_DELAY_S = 0.5
DEBOUNCE_KEY_TIMEOUT_S = 10  # a lost message blocks asks this long at most (the sweep covers it)
DEBOUNCE_TRUSTED_FRACTION = 0.8
_asked_until: dict[tuple[str, int], float] = {}  # (task, subject) -> wall-clock time


def debounce_key(task: str, subject: int) -> str:
    return f"strop:debounce:{task}:{subject}"


def debounced_enqueue(task: str, subject: int) -> None:
    """Send ``task(subject)`` in ``DEBOUNCE_DELAY_S`` unless a run already due will see this ask.

    Called after the caller's transaction committed, so it must not fail the caller: with the cache
    (Redis) down, nothing is sent, and the caller's periodic sweep covers it."""
    asked = time.time()
    if asked < _asked_until.get((task, subject), 0.0):
        return  # the pending run has not started: it will see this ask
    due_ms = int((asked + DEBOUNCE_DELAY_S) * 1000)
    try:
        pending_due_ms = cache_add_or_get(debounce_key(task, subject), due_ms, timeout_s=DEBOUNCE_KEY_TIMEOUT_S)
    except Exception as exc:  # the cache backend's own errors (redis, files); none may fail the caller
        logger.warning("%s(%s) not asked for (the cache failed: %s); the sweep will cover it", task, subject, exc)
        return
    margin_s = DEBOUNCE_DELAY_S * (1 - DEBOUNCE_TRUSTED_FRACTION)
    if pending_due_ms is not None:  # another ask's run is pending, due then (a key left by a lost one: in the past)
        # Never trusted longer than this process's own ask would be: a clock far ahead stays harmless.
        _asked_until[(task, subject)] = min(pending_due_ms, due_ms) / 1000 - margin_s
    elif enqueue(task, subject, countdown=DEBOUNCE_DELAY_S, expires=60):
        _asked_until[(task, subject)] = due_ms / 1000 - margin_s


def debounce_clear(task: str, subject: int) -> None:
    """The run of ``task(subject)`` starts: an ask from now on asks for a run of its own."""
    try:
        cache.delete(debounce_key(task, subject))
    except Exception as exc:  # the key expires on its own; the run itself must still go on
        logger.warning("could not clear the debounce of %s(%s): %s", task, subject, exc)
