"""Beat schedules once, however many beat processes run (``CELERY_BEAT_SCHEDULER``).

Every beat process ticks, but a tick sends nothing unless this process holds the beat lock:

- With Redis (``REDIS_URL``, or a Redis broker): a key set with ``SET NX PX`` to a token of this
  process, lapsing ``STROP_BEAT_LOCK_TTL_S`` after it was last renewed. The holder renews it at
  every tick (ticks come at least every third of the TTL), and deletes it on a clean stop only if
  it still holds its own token. A beat that finds it taken logs once that it stands by and asks
  again every few seconds; when the holder dies, its key lapses and the next ask takes it.
- Without Redis (the embedded default, one machine): an ``fcntl`` lock on a file under
  ``VAR_DIR``, which the kernel releases the moment its holder exits, however it exits.

A holder that cannot reach Redis, or finds another's token under the key (it stalled past the
TTL), stops sending at once and stands by. On taking over, a beat sends what its own schedule
says is due, so each periodic task runs soon after the handover (they are all idempotent).

Every tick also records that beat was seen alive (``strop_process_last_seen_timestamp_seconds``).
"""

from __future__ import annotations

import fcntl
import logging
import os
import secrets
import socket
from pathlib import Path
from typing import Any, Protocol

import redis
from celery import signals
from celery.beat import PersistentScheduler, beat_nodename
from django.conf import settings

from apps.common.observability.last_seen import process_gone, process_seen

logger = logging.getLogger(__name__)

LOCK_KEY = "strop:beat:lock"
LOCK_FILE = "celerybeat.lock"
ROLE = "beat"
# How often a beat that stands by asks for the lock again (at most; a short TTL asks more often).
STANDBY_CHECK_S = 5.0

# Compare-and-renew and compare-and-delete: only the holder's own token may extend or drop the key.
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
    return redis.call('DEL', KEYS[1])
end
return 0
"""


class BeatLock(Protocol):
    def hold(self) -> bool:
        """Take the lock, or renew it if held; True while this process holds it."""

    def release(self) -> None: ...


class RedisBeatLock:
    def __init__(self, url: str, *, ttl_s: float) -> None:
        self.ttl_ms = max(1, int(ttl_s * 1000))
        # Who holds it is readable in Redis (GET strop:beat:lock); the random part keeps a restarted
        # process with the same pid from passing for its predecessor.
        self.token = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(8)}"
        timeout = min(2.0, max(0.2, ttl_s / 4))
        self.client = redis.Redis.from_url(url, socket_timeout=timeout, socket_connect_timeout=timeout)
        self._renew = self.client.register_script(_RENEW)
        self._release = self.client.register_script(_RELEASE)
        self._unreachable = False

    def hold(self) -> bool:
        try:
            held = bool(self._renew(keys=[LOCK_KEY], args=[self.token, self.ttl_ms])) or bool(
                self.client.set(LOCK_KEY, self.token, nx=True, px=self.ttl_ms)
            )
        except redis.RedisError as exc:
            if not self._unreachable:
                logger.warning("beat: cannot reach Redis for the beat lock (%s); sending nothing until it answers", exc)
            self._unreachable = True
            return False
        self._unreachable = False
        return held

    def release(self) -> None:
        try:
            self._release(keys=[LOCK_KEY], args=[self.token])
        except redis.RedisError as exc:  # it lapses on its own after the TTL
            logger.warning("beat: could not release the beat lock (%s); it lapses by itself", exc)


class FileBeatLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def hold(self) -> bool:
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # another beat holds it
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{socket.gethostname()}:{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the only descriptor drops the flock
            self._fd = None


def beat_lock() -> BeatLock:
    """Redis when there is one (``REDIS_URL``, else a Redis broker), else a file under ``VAR_DIR``."""
    broker = str(settings.CELERY_BROKER_URL or "")
    url = settings.REDIS_URL or (broker if broker.startswith(("redis://", "rediss://", "unix://")) else "")
    if url:
        return RedisBeatLock(url, ttl_s=float(settings.STROP_BEAT_LOCK_TTL_S))
    return FileBeatLock(Path(settings.VAR_DIR) / LOCK_FILE)


# The node name beat answers remote control on (``-n``, default celerybeat@host), set as it starts.
_beat_name: str | None = None


@signals.beat_init.connect
def note_beat_name(sender: Any = None, **_: Any) -> None:
    global _beat_name
    _beat_name = beat_nodename(getattr(sender, "hostname", None))


class SingleBeatScheduler(PersistentScheduler):
    """Celery's persistent scheduler, whose ticks send only while this process holds the beat lock."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        ttl_s = float(settings.STROP_BEAT_LOCK_TTL_S)
        # The holder renews at every tick, so a tick comes at least every third of the TTL.
        self.renew_every_s = max(0.2, ttl_s / 3)
        self.standby_check_s = min(STANDBY_CHECK_S, self.renew_every_s)
        self.lock = beat_lock()
        self.holding = False
        self.standing_by = False
        super().__init__(*args, **kwargs)

    @property
    def node_name(self) -> str:
        return _beat_name or beat_nodename(None)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        held = self.lock.hold()
        process_seen(ROLE, self.node_name)
        if not held:
            if self.holding:
                logger.warning("beat %s lost the beat lock; it sends nothing and stands by", self.node_name)
            elif not self.standing_by:
                logger.info("beat %s: another beat holds the beat lock; standing by", self.node_name)
            self.holding, self.standing_by = False, True
            return self.standby_check_s
        if not self.holding:
            logger.info("beat %s holds the beat lock; it schedules", self.node_name)
        self.holding, self.standing_by = True, False
        return min(super().tick(*args, **kwargs), self.renew_every_s)

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.holding:
                self.lock.release()
                self.holding = False
            process_gone(ROLE, self.node_name)
