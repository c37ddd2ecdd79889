"""Postgres restarted under batch ingest: the API answers 503 with Retry-After while the database
is down, the SDK's retries finish the job, and every item sent is stored exactly once.

The database is a private cluster (the machine's Postgres is shared); the API is gunicorn."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.fixtures.services import http_status_recorder, manage
from tests.fixtures.workers import wait_until

pytestmark = pytest.mark.slow

DBNAME = "strop_faults_pg"
BATCH = 50
BATCHES_AFTER_RESTART = 3


def _item(client_id: str) -> dict[str, object]:
    return {"client_id": client_id, "prompt": f"{client_id} = ", "completion": "1", "end_user_id": "dev-1"}


def test_batch_ingest_rides_out_a_postgres_restart_with_nothing_lost_or_doubled(
    private_postgres, api_servers, settings
):
    from strop import Strop

    db_url = private_postgres.create_database(DBNAME)
    key = manage("tenant_create", "Faults", "--slug", "faults", "--key-only", env={"DATABASE_URL": db_url})
    api = api_servers.start(database_url=db_url, workers=2, REDIS_URL=settings.REDIS_URL)

    http, seen = http_status_recorder()
    client = Strop(base_url=api.url, api_key=key, max_retries=60, http_client=http)
    sent: list[str] = []
    acknowledged: dict[str, str] = {}
    failures: list[BaseException] = []
    restarted = threading.Event()
    after_restart = 0

    def ingest() -> None:
        """Batch after batch, without pause, until a few have gone through after the restart."""
        nonlocal after_restart
        number = 0
        try:
            while after_restart < BATCHES_AFTER_RESTART:
                started_after_restart = restarted.is_set()
                batch = [_item(f"pgr-{number}-{i}") for i in range(BATCH)]
                number += 1
                sent.extend(str(item["client_id"]) for item in batch)
                result = client.interactions.log_batch(batch)
                for verdict in result.results:
                    acknowledged[str(verdict.client_id)] = verdict.status
                after_restart += started_after_restart
        except BaseException as exc:  # reported by the test below
            failures.append(exc)

    thread = threading.Thread(target=ingest, name="ingest", daemon=True)
    thread.start()
    try:
        wait_until(lambda: len(acknowledged) >= 3 * BATCH or failures, timeout=120, what="ingest to flow")
        assert not failures, failures

        private_postgres.stop("immediate")  # a crash: open transactions die, recovery runs at start
        wait_until(
            lambda: any(status == 503 for status, _ in seen) or failures,
            timeout=120,
            what="the SDK to meet a 503 while the database is down",
        )
        started = time.monotonic()
        probe = httpx.get(f"{api.url}/v1/tenant", headers={"Authorization": f"Bearer {key}"}, timeout=60)
        probe_s = time.monotonic() - started
        assert probe.status_code == 503, probe.text
        assert probe.json()["error"]["code"] == "service_unavailable"
        assert int(probe.headers["Retry-After"]) >= 1
        assert probe_s < 10, f"a request while the database is down took {probe_s:.1f} s"
        assert httpx.get(f"{api.url}/health", timeout=60).status_code == 503  # load balancers see it too

        private_postgres.start()
        restarted.set()
        thread.join(timeout=300)
        assert not thread.is_alive(), "ingest did not finish after the database came back"
    finally:
        restarted.set()
        after_restart = BATCHES_AFTER_RESTART  # stops a thread left running by a failure above
        client.close()
    assert not failures, f"the SDK gave up: {failures!r}\n{api.log_tail()}"

    statuses = [status for status, _ in seen]
    assert 503 in statuses
    assert all(retry_after is not None and int(retry_after) >= 1 for status, retry_after in seen if status == 503)
    assert not [s for s in statuses if s >= 500 and s != 503], f"errors other than 503: {statuses}\n{api.log_tail()}"

    # Every item was acknowledged (stored now or by an earlier try whose answer was lost) ...
    assert set(acknowledged) == set(sent) and len(sent) == len(set(sent))
    assert set(acknowledged.values()) <= {"created", "duplicate"}, set(acknowledged.values())
    # ... and the database holds each exactly once.
    rows = private_postgres.query(
        DBNAME,
        "SELECT count(*), count(DISTINCT client_id) FROM interactions_interaction WHERE client_id LIKE 'pgr-%%'",
    )
    assert rows == [(len(sent), len(sent))]
    stored = {r[0] for r in private_postgres.query(DBNAME, "SELECT client_id FROM interactions_interaction")}
    assert stored == set(sent)


@pytest.mark.django_db
def test_only_a_failed_connection_is_a_503_and_an_error_of_the_statement_stays_a_500():
    """A statement timeout is an OperationalError too, but the same request would fail again."""
    from django.db import OperationalError, connection, connections, transaction

    from apps.common.exception_handler import database_unreachable, exception_handler

    with pytest.raises(OperationalError) as timed_out, transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SET LOCAL statement_timeout = 1")
        cursor.execute("SELECT pg_sleep(1)")
    assert not database_unreachable(timed_out.value)
    assert exception_handler(timed_out.value, {}) is None  # DRF answers 500 and logs it

    unreachable = type(connections["default"])({**connection.settings_dict, "PORT": "1"})
    with pytest.raises(OperationalError) as refused:
        unreachable.ensure_connection()
    assert database_unreachable(refused.value)
    response = exception_handler(refused.value, {})
    assert response is not None and response.status_code == 503 and int(response["Retry-After"]) >= 1
