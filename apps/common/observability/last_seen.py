"""When each worker and beat process was last seen alive: written by the processes, read by /metrics.

A Celery worker is seen at each of its heartbeats (``celery_signals``), beat at each tick of its
scheduler (``workers/beat.py``); either writes at most every ``WRITE_EVERY_S``. A process that
stops cleanly removes its entry; one that dies keeps its last time, so the age of the series
says how long it has been gone. Entries older than ``FORGET_AFTER_S`` are dropped.

Where the entries live: a sorted set in Redis (``REDIS_URL``: one key, one round trip to read),
or, on the embedded default without Redis, one small file per process under ``VAR_DIR``.
Writing never raises into the process that is seen: a lost write is logged and the next one
comes a few seconds later. Nothing here loads prometheus_client (workers and beat import this
before they may have chosen their metrics folder); ``collectors`` turns the entries into a gauge.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import redis
from django.conf import settings

logger = logging.getLogger(__name__)

REDIS_KEY = "strop:process-last-seen"
WRITE_EVERY_S = 10.0
FORGET_AFTER_S = 7 * 24 * 3600
# A hung Redis must not hold a worker's event loop or beat's tick for long.
REDIS_TIMEOUT_S = 0.5

# (role, name) -> monotonic time of this process's last write.
_written: dict[tuple[str, str], float] = {}


@functools.cache
def _redis(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT_S, socket_connect_timeout=REDIS_TIMEOUT_S)


def _folder() -> Path:
    return Path(settings.VAR_DIR) / "last-seen"


def _file(role: str, name: str) -> Path:
    return _folder() / (hashlib.sha256(f"{role}\n{name}".encode()).hexdigest()[:32] + ".json")


def _member(role: str, name: str) -> str:
    return json.dumps([role, name])


def process_seen(role: str, name: str, *, force: bool = False) -> None:
    """Record that process ``name`` (a Celery node name such as ``gpu@host``) in ``role`` is alive
    now; at most every ``WRITE_EVERY_S`` unless ``force``."""
    now = time.monotonic()
    last = _written.get((role, name))
    if not force and last is not None and now - last < WRITE_EVERY_S:
        return
    _written[(role, name)] = now
    seen_at = time.time()
    try:
        if settings.REDIS_URL:
            pipe = _redis(settings.REDIS_URL).pipeline(transaction=False)
            pipe.zadd(REDIS_KEY, {_member(role, name): seen_at})
            pipe.zremrangebyscore(REDIS_KEY, "-inf", seen_at - FORGET_AFTER_S)
            pipe.execute()
        else:
            path = _file(role, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            staging = path.with_suffix(f".tmp-{os.getpid()}")
            staging.write_text(json.dumps({"role": role, "name": name, "seen_at": seen_at}))
            staging.replace(path)
    except (redis.RedisError, OSError) as exc:
        logger.warning("could not record that %s %s was seen: %s", role, name, exc)


def process_gone(role: str, name: str) -> None:
    """A process that stops cleanly takes its entry away (one that dies leaves its last time)."""
    _written.pop((role, name), None)
    try:
        if settings.REDIS_URL:
            _redis(settings.REDIS_URL).zrem(REDIS_KEY, _member(role, name))
        else:
            _file(role, name).unlink(missing_ok=True)
    except (redis.RedisError, OSError) as exc:
        logger.warning("could not remove the last-seen time of %s %s: %s", role, name, exc)


def processes_last_seen() -> list[tuple[str, str, float]]:
    """(role, name, unix time last seen) of every process seen in the last ``FORGET_AFTER_S``."""
    horizon = time.time() - FORGET_AFTER_S
    seen: list[tuple[str, str, float]] = []
    if settings.REDIS_URL:
        found: Any = _redis(settings.REDIS_URL).zrangebyscore(REDIS_KEY, horizon, "+inf", withscores=True)
        for member, score in found:
            role, name = json.loads(member)
            seen.append((str(role), str(name), float(score)))
        return seen
    folder = _folder()
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            entry = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # removed or being replaced while listed
        if float(entry["seen_at"]) >= horizon:
            seen.append((str(entry["role"]), str(entry["name"]), float(entry["seen_at"])))
    return seen
