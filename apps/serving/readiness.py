"""Whether this API process can serve: its dependencies, each asked once, all at the same time.

``GET /health/ready`` (``health_apis.HealthReadyApi``) reads this; ``GET /health`` stays the cheap
liveness probe. Checked: the database (a fresh connection and ``SELECT 1``), Redis when
configured (``PING``), the adapter store (``check()``: the folder can be written, or the bucket
answers) and the vLLM replicas (``GET /health``, then ``GET /v1/models`` with Strop's key, which
``/health`` does not need; ready while at least one answers both).

Each check runs in a thread of its own and the answer waits at most ``STROP_READY_TIMEOUT_S`` for
all of them: a check that has not answered by then fails as "no answer", and its thread is left
to end on its own socket timeout. What a check says in the answer never names a host, a URL or a
path (replicas are numbered from 1 in ``VLLM_BASE_URLS``' order, as in ``adapters/loading.py``);
the operator's log has the full error under the request's id.

``GET /health/ready`` is public, so it reads :func:`readiness_cached`: one check per process every
``STROP_READY_CACHE_S`` seconds at most, callers that arrive while it runs waiting for it and
sharing its answer. However many probes (or anyone else) call, a process opens at most one set of
connections to its dependencies per window, and a slow dependency holds one thread, not every
thread. ``strop_readiness_checks_total`` counts the checks run.
"""

from __future__ import annotations

import copy
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections

from apps.adapters.store import StoreError, adapter_store
from apps.common.exception_handler import public_text
from apps.common.observability.metrics import readiness_checked
from apps.engines.vllm_client import VLLMClient
from apps.engines.vllm_errors import VLLMError

logger = logging.getLogger(__name__)


# What a replica's check says when it answers /health but refuses the key on a guarded route.
KEY_REFUSED = "vLLM refused Strop's API key (VLLM_API_KEY is not the key vLLM was started with)"


class CheckFailed(Exception):
    """A dependency answered, and not well; the message is safe to show (no host, URL or path)."""


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    ms: float
    error: str = ""
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"ok": self.ok, "ms": round(self.ms, 1), **self.details}
        if self.error:
            shown["error"] = self.error
        return shown


@dataclass(frozen=True)
class Readiness:
    checks: dict[str, CheckResult]

    @property
    def ready(self) -> bool:
        return all(check.ok for check in self.checks.values())

    @property
    def failing(self) -> list[str]:
        return [name for name, check in self.checks.items() if not check.ok]


def _database_check(timeout_s: float) -> Callable[[], None]:
    # A connection of the check's own, opened and closed in its thread (Django's are per thread), with
    # a connect timeout on Postgres: a server that accepts but never answers must not hold the thread.
    current = connections[DEFAULT_DB_ALIAS]
    params = copy.deepcopy(current.settings_dict)
    if current.vendor == "postgresql":
        params["OPTIONS"]["connect_timeout"] = max(2, math.ceil(timeout_s))

    def check() -> None:
        probe = type(current)(params, DEFAULT_DB_ALIAS)
        try:
            with probe.cursor() as cursor:
                cursor.execute("SELECT 1")
        finally:
            probe.close()

    return check


def _redis_check(url: str, timeout_s: float) -> Callable[[], None]:
    def check() -> None:
        client = redis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        try:
            client.ping()
        finally:
            client.close()

    return check


def _adapter_store_check() -> None:
    try:
        adapter_store().check()
    except StoreError as exc:  # its messages say what failed without where (apps/adapters/store.py)
        raise CheckFailed(public_text(str(exc), max_length=200)) from exc


def _replica_check(url: str, timeout_s: float) -> Callable[[], None]:
    client = VLLMClient([url], api_key=settings.VLLM_API_KEY, connect_timeout=timeout_s, admin_timeout=timeout_s)

    def check() -> None:
        if not client.health(timeout=timeout_s).get(client.base_urls[0]):
            raise CheckFailed("its /health did not answer 200")
        # /health is open to anyone (platform/vllm_plugins/strop_vllm_auth.py, OPEN_PATHS): only a
        # guarded route shows that Strop's key is the one the replica was started with. /v1/models is
        # the cheapest: no engine work, one small answer.
        try:
            client.models(client.base_urls[0])
        except VLLMError as exc:
            if exc.vllm_status in (401, 403):
                raise CheckFailed(KEY_REFUSED) from exc
            raise

    return check


def _run(name: str, check: Callable[[], None], results: dict[str, CheckResult], lock: threading.Lock) -> None:
    started = time.perf_counter()
    try:
        check()
        result = CheckResult(ok=True, ms=(time.perf_counter() - started) * 1000)
    except CheckFailed as exc:
        result = CheckResult(ok=False, ms=(time.perf_counter() - started) * 1000, error=str(exc))
    except Exception as exc:  # any driver's error: its type for the answer, all of it for the operator
        logger.warning("readiness: the %s check failed: %s: %s", name, type(exc).__name__, exc)
        result = CheckResult(ok=False, ms=(time.perf_counter() - started) * 1000, error=f"{type(exc).__name__}")
    with lock:
        results[name] = result


_cache_lock = threading.Lock()
_cached: dict[tuple[Any, ...], tuple[float, Readiness]] = {}


def _configuration() -> tuple[Any, ...]:
    """What a readiness answer depends on: a changed setting is never answered from an old check."""
    database = connections[DEFAULT_DB_ALIAS].settings_dict
    return (
        database.get("ENGINE"),
        database.get("HOST"),
        database.get("PORT"),
        database.get("NAME"),
        settings.REDIS_URL,
        settings.STROP_ADAPTER_STORE,
        str(settings.STROP_ADAPTER_ROOT),
        tuple(settings.VLLM_BASE_URLS),
        settings.VLLM_API_KEY,  # the replicas' check proves the key: a new key is checked again
        settings.STROP_READY_TIMEOUT_S,
    )


def readiness_cached() -> Readiness:
    """This process's last :func:`readiness_check` while younger than ``STROP_READY_CACHE_S``, else a
    new one. One check at a time: a caller that arrives while one runs waits for it (at most
    ``STROP_READY_TIMEOUT_S``) and takes its answer instead of starting another."""
    key = _configuration()
    with _cache_lock:
        seen = _cached.get(key)
        if seen is None or time.monotonic() - seen[0] >= settings.STROP_READY_CACHE_S:
            readiness = readiness_check()
            seen = (time.monotonic(), readiness)
            _cached.clear()  # one configuration per process: nothing else is ever asked for again
            _cached[key] = seen
        return seen[1]


def readiness_check(*, timeout_s: float | None = None) -> Readiness:
    """Ask every dependency at once; each has ``timeout_s`` (default ``STROP_READY_TIMEOUT_S``)."""
    readiness_checked()
    timeout_s = settings.STROP_READY_TIMEOUT_S if timeout_s is None else timeout_s
    replicas = list(settings.VLLM_BASE_URLS)
    checks: dict[str, Callable[[], None]] = {"database": _database_check(timeout_s)}
    if settings.REDIS_URL:
        checks["redis"] = _redis_check(settings.REDIS_URL, timeout_s)
    checks["adapter_store"] = _adapter_store_check
    for number, url in enumerate(replicas, start=1):
        checks[f"vllm replica {number}"] = _replica_check(url, timeout_s)

    results: dict[str, CheckResult] = {}
    lock = threading.Lock()
    started = time.monotonic()
    threads = [
        threading.Thread(target=_run, args=(name, check, results, lock), name=f"ready-{name}", daemon=True)
        for name, check in checks.items()
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, started + timeout_s - time.monotonic()))
    with lock:
        answered = dict(results)  # a check that answers from here on is not waited for
    waited_ms = (time.monotonic() - started) * 1000
    late = CheckResult(ok=False, ms=waited_ms, error=f"no answer within {timeout_s:g} s")
    for name in checks:
        if name not in answered:
            logger.warning("readiness: the %s check did not answer within %g s", name, timeout_s)
    shown = {name: answered.get(name, late) for name in checks if not name.startswith("vllm replica ")}
    shown["vllm"] = _replicas_summary([answered.get(f"vllm replica {n}", late) for n in range(1, len(replicas) + 1)])
    return Readiness(checks=shown)


def _replicas_summary(replicas: list[CheckResult]) -> CheckResult:
    """Ready while at least one replica answers; the others are named by their number."""
    up = [number for number, result in enumerate(replicas, start=1) if result.ok]
    down = {str(number): result.error for number, result in enumerate(replicas, start=1) if not result.ok}
    details: dict[str, Any] = {"replicas": len(replicas), "replicas_up": len(up)}
    if down:
        details["down"] = down
    ms = max((result.ms for result in replicas), default=0.0)
    if up:
        return CheckResult(ok=True, ms=ms, details=details)
    errors = set(down.values())
    if errors == {KEY_REFUSED}:  # the operator's mistake, not the replicas': say it first
        return CheckResult(ok=False, ms=ms, error=KEY_REFUSED, details=details)
    return CheckResult(ok=False, ms=ms, error="no vLLM replica answered /health", details=details)
