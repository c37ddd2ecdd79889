"""GET /health/ready: the database, Redis, the adapter store and at least one vLLM replica, each
within STROP_READY_TIMEOUT_S; 503 names what fails, never where it runs, and only to operators
(the metrics token, or loopback). Each process answers from one check per STROP_READY_CACHE_S.
GET /health stays the cheap liveness probe. Every dependency is real: the session's vLLM, a Redis and a Postgres of the
test's own where a test stops one."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import httpx
import pytest

pytestmark = pytest.mark.django_db

DEAD = "http://127.0.0.1:9"  # nothing listens on the discard port


def _hides_where_things_run(body: str, *addresses: str) -> None:
    assert "http" not in body and "127.0.0.1" not in body and "/tmp" not in body, body
    for address in addresses:
        assert address not in body, body


@pytest.mark.vllm
def test_ready_with_one_of_two_replicas_up_names_the_other_by_number(client, served, settings):
    settings.VLLM_BASE_URLS = [served.base_url, DEAD]
    response = client.get("/health/ready")  # no key: probes carry none
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "ready"
    assert set(body["checks"]) == {"database", "redis", "adapter_store", "vllm"}
    assert all(check["ok"] for check in body["checks"].values())
    vllm = body["checks"]["vllm"]
    assert (vllm["replicas"], vllm["replicas_up"], list(vllm["down"])) == (2, 1, ["2"])
    _hides_where_things_run(response.content.decode(), served.base_url.split("//")[1])


def test_no_replica_answering_is_not_ready(client, settings):
    settings.VLLM_BASE_URLS = [DEAD]
    response = client.get("/health/ready")
    assert response.status_code == 503
    body = response.json()
    assert (body["status"], body["failing"]) == ("not_ready", ["vllm"])
    assert body["checks"]["vllm"]["replicas_up"] == 0 and body["checks"]["database"]["ok"]
    _hides_where_things_run(response.content.decode())


def test_an_adapter_store_that_cannot_be_written_is_not_ready(client, settings, tmp_path):
    (tmp_path / "a-file").write_text("")
    settings.STROP_ADAPTER_ROOT = tmp_path / "a-file" / "adapters"  # a folder under a file: never writable
    settings.VLLM_BASE_URLS = [DEAD]
    response = client.get("/health/ready")
    assert response.status_code == 503
    body = response.json()
    assert set(body["failing"]) == {"adapter_store", "vllm"}
    assert "cannot be written" in body["checks"]["adapter_store"]["error"]
    _hides_where_things_run(response.content.decode(), str(tmp_path))


def test_a_redis_that_is_down_or_hung_is_not_ready_and_a_hung_one_costs_at_most_the_time_limit(
    client, settings, private_redis
):
    settings.STROP_READY_CACHE_S = 0  # every call checks: the test stops Redis between calls
    settings.REDIS_URL = private_redis.url()
    settings.STROP_READY_TIMEOUT_S = 1.0
    settings.VLLM_BASE_URLS = [DEAD]
    assert client.get("/health/ready").json()["checks"]["redis"]["ok"] is True

    assert private_redis.proc is not None
    os.kill(private_redis.proc.pid, signal.SIGSTOP)  # hung: connections open, nothing answers
    try:
        started = time.monotonic()
        response = client.get("/health/ready")
        elapsed = time.monotonic() - started
    finally:
        os.kill(private_redis.proc.pid, signal.SIGCONT)
    assert response.status_code == 503
    assert "redis" in response.json()["failing"]
    assert elapsed < 10, f"a hung Redis held the readiness answer {elapsed:.1f} s"

    private_redis.stop()  # gone: the port refuses
    response = client.get("/health/ready")
    assert response.status_code == 503 and "redis" in response.json()["failing"]
    _hides_where_things_run(response.content.decode(), str(private_redis.port))


def test_liveness_stays_cheap_and_ignores_the_dependencies_readiness_checks(client, settings, tmp_path):
    (tmp_path / "a-file").write_text("")
    settings.STROP_ADAPTER_ROOT = tmp_path / "a-file" / "adapters"
    settings.VLLM_BASE_URLS = [DEAD]
    response = client.get("/health")
    assert response.status_code == 200 and response.json()["status"] == "ok"


def test_ready_is_public_and_out_of_the_tenant_api_schema(client):
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    assert "/health" in schema["paths"] and "/health/ready" not in schema["paths"]
    response = client.get("/health/ready", HTTP_AUTHORIZATION="Bearer not-a-key")  # a bad key is ignored
    assert response.status_code in (200, 503)
    assert "Content-Security-Policy" not in response


@pytest.mark.slow
@pytest.mark.vllm
def test_the_api_under_gunicorn_is_ready_until_its_database_stops(private_postgres, api_servers, served, settings):
    db_url = private_postgres.create_database("strop_ready")
    api = api_servers.start(
        database_url=db_url,
        workers=1,
        REDIS_URL=settings.REDIS_URL,
        VLLM_BASE_URLS=served.base_url,
        STROP_READY_CACHE_S="0",  # every call checks: the test stops the database between calls
    )
    ready = httpx.get(f"{api.url}/health/ready", timeout=60)
    assert ready.status_code == 200, f"{ready.text}\n{api.log_tail()}"

    private_postgres.stop("immediate")
    started = time.monotonic()
    response = httpx.get(f"{api.url}/health/ready", timeout=60)
    elapsed = time.monotonic() - started
    assert response.status_code == 503, response.text
    assert response.json()["failing"] == ["database"]
    assert elapsed < 15, f"the readiness answer took {elapsed:.1f} s with the database down"
    _hides_where_things_run(response.text, str(private_postgres.port))
    assert httpx.get(f"{api.url}/health", timeout=60).status_code == 503  # liveness says so too


def _checks_run(client) -> float:
    """strop_readiness_checks_total, read from /metrics (this test's client is a loopback caller)."""
    from prometheus_client.parser import text_string_to_metric_families

    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            if sample.name == "strop_readiness_checks_total":
                return sample.value
    return 0.0


def _dead_replica() -> str:
    """A replica nothing answers, under an address of its own: no earlier test's check is reused."""
    return f"{DEAD}/{uuid.uuid4().hex}"


def test_calls_within_the_cache_window_share_one_check(client, settings):
    settings.STROP_READY_CACHE_S = 300
    settings.VLLM_BASE_URLS = [_dead_replica()]
    before = _checks_run(client)
    first, second = client.get("/health/ready"), client.get("/health/ready")
    assert first.status_code == second.status_code == 503
    assert first.json() == second.json()
    assert _checks_run(client) == before + 1

    settings.STROP_READY_CACHE_S = 0  # no window: each call checks, as the counter shows
    client.get("/health/ready")
    client.get("/health/ready")
    assert _checks_run(client) == before + 3


def test_concurrent_callers_wait_for_the_check_in_flight_instead_of_starting_their_own(client, settings):
    from apps.serving.readiness import readiness_cached

    settings.STROP_READY_CACHE_S = 300
    settings.VLLM_BASE_URLS = [_dead_replica()]
    before = _checks_run(client)
    answers: list[bool] = []
    start = threading.Barrier(8)

    def call() -> None:
        start.wait()
        answers.append(readiness_cached().ready)

    threads = [threading.Thread(target=call) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert answers == [False] * 8
    assert _checks_run(client) == before + 1


def test_callers_from_elsewhere_get_the_status_only(client, settings):
    settings.VLLM_BASE_URLS = [_dead_replica()]
    remote = client.get("/health/ready", REMOTE_ADDR="203.0.113.7")
    assert (remote.status_code, remote.json()) == (503, {"status": "not_ready"})
    proxied = client.get("/health/ready", HTTP_X_FORWARDED_FOR="203.0.113.7")  # loopback, but via a proxy
    assert proxied.json() == {"status": "not_ready"}
    local = client.get("/health/ready")
    assert local.json()["failing"] == ["vllm"] and "checks" in local.json()

    settings.STROP_METRICS_TOKEN = "a-metrics-token-for-this-test-only"
    assert client.get("/health/ready").json() == {"status": "not_ready"}  # with a token set, loopback is not enough
    with_token = client.get(
        "/health/ready", REMOTE_ADDR="203.0.113.7", HTTP_AUTHORIZATION="Bearer a-metrics-token-for-this-test-only"
    )
    assert with_token.status_code == 503 and with_token.json()["failing"] == ["vllm"]
    wrong = client.get("/health/ready", REMOTE_ADDR="203.0.113.7", HTTP_AUTHORIZATION="Bearer not-the-token")
    assert wrong.json() == {"status": "not_ready"}
