"""When each worker and beat was last seen alive, on GET /metrics: real worker and beat processes
writing to a Redis of the test's own, read back by the API's scrape."""

from __future__ import annotations

import os
import socket
import time

import pytest

from tests.fixtures.workers import Workers, wait_until, worker_env
from tests.ops.conftest import scrape

pytestmark = [pytest.mark.slow, pytest.mark.django_db]

METRIC = "strop_process_last_seen_timestamp_seconds"


def _last_seen(client, role: str, name: str) -> float | None:
    return scrape(client).get((METRIC, frozenset({("role", role), ("name", name)})))


def test_workers_and_beat_are_seen_while_they_run_a_dead_one_keeps_its_last_time_and_a_stopped_one_goes(
    client, settings, private_redis, beats, tmp_path
):
    settings.REDIS_URL = private_redis.url()  # where this process's scrape reads the processes
    env = worker_env(settings, run_root=tmp_path / "runs", CELERY_BROKER_URL=private_redis.url())
    workers = Workers(env=env, log_dir=tmp_path)
    host = socket.gethostname()
    try:
        workers.start("steady", "serving", "threads")
        workers.start("doomed", "default", "threads")
        beats.start("only", {"REDIS_URL": private_redis.url(), "CELERY_BROKER_URL": private_redis.url()})
        steady, doomed = (f"{name}-{os.getpid()}@{host}" for name in ("steady", "doomed"))  # their -n
        seen = {
            ("worker-serving", steady): None,
            ("worker-default", doomed): None,
            ("beat", beats.seen_name("only")): None,
        }

        def all_seen() -> bool:
            for role, name in seen:
                seen[(role, name)] = _last_seen(client, role, name)
            return all(value is not None for value in seen.values())

        wait_until(all_seen, timeout=180, what=f"{sorted(seen)} on /metrics", workers=workers)
        assert all(abs(time.time() - value) < 120 for value in seen.values() if value is not None)
        first_steady = seen[("worker-serving", steady)]
        assert first_steady is not None

        workers.kill("doomed")  # SIGKILL: no shutdown signal, its entry stays
        killed_at = time.time()
        doomed_last = _last_seen(client, "worker-default", doomed)
        assert doomed_last is not None and doomed_last <= killed_at
        # The living worker is seen again (its heartbeats are written every ten seconds) ...
        wait_until(
            lambda: (_last_seen(client, "worker-serving", steady) or 0) > killed_at,
            timeout=120,
            what="the steady worker to be seen again",
            workers=workers,
        )
        # ... while the dead one keeps the time it was last seen.
        assert _last_seen(client, "worker-default", doomed) == doomed_last

        workers.stop_all()  # SIGTERM: the worker takes its entry away as it stops
        assert beats.stop("only") == 0
        samples = scrape(client)
        assert (METRIC, frozenset({("role", "worker-serving"), ("name", steady)})) not in samples
        assert (METRIC, frozenset({("role", "beat"), ("name", beats.seen_name("only"))})) not in samples
        assert samples[(METRIC, frozenset({("role", "worker-default"), ("name", doomed)}))] == doomed_last
        assert samples[("strop_scrape_source_up", frozenset({("source", "processes")}))] == 1
    finally:
        workers.stop_all()
