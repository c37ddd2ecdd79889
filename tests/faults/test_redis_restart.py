"""Redis restarted under the API and the workers (a private Redis, their broker and cache):
ingest goes on while it is down, rate limits fail open with one log line, a request that would
enqueue costs at most about a second, and the work whose messages Redis lost is recovered by
beat's sweepers once it is back. And a hung Redis (stopped, not gone) costs no more.

Redis here keeps nothing on disk, so a restart loses every queued message, as in production."""

from __future__ import annotations

import signal
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from django.utils import timezone

from apps.adapters.services import adapter_create, base_model_register
from apps.training.models import TrainingPolicy, TrainingRun
from tests.fixtures.services import PrivateRedis
from tests.fixtures.workers import CPU_QUEUES, Workers, _database_url, wait_until, worker_env

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

FAIL_OPEN_LINE = "rate limits are not enforced"
ENFORCED_AGAIN_LINE = "rate limits are enforced"
QUICK_S = 5.0  # a request while Redis is down, on a busy machine (a hung publish used to wait forever)
PUBLISH_S = 3.0  # a publish to a hung Redis: about a second, by the settings


def _send_as_beat(redis_url: str, task: str) -> None:
    """What beat does: send ``task`` by name to the broker at ``redis_url``."""
    from config.celery import app

    with app.connection_for_write(redis_url) as connection:
        app.send_task(task, connection=connection)


class _Api:
    def __init__(self, url: str, key: str) -> None:
        self.url, self.key = url, key

    def call(self, method: str, path: str, body: object = None) -> tuple[httpx.Response, float]:
        started = time.monotonic()
        response = httpx.request(
            method, f"{self.url}{path}", json=body, headers={"Authorization": f"Bearer {self.key}"}, timeout=60
        )
        return response, time.monotonic() - started


@pytest.fixture
def stack(
    private_redis: PrivateRedis, api_servers, settings, tmp_path: Path, make_tenant, make_client, tiny_starter_model
):
    """The API (one gunicorn worker, so one process logs) and a default and a gpu worker, on the
    private Redis; two tenants: ``burst`` learns after 12 events, ``manual`` starts runs by hand.
    Their runs fail at once (a bad trainer option, or no events): only their scheduling is tested."""
    redis_url = private_redis.url()
    workers = Workers(
        env=worker_env(settings, run_root=tmp_path / "runs", REDIS_URL=redis_url, CELERY_BROKER_URL=redis_url),
        log_dir=tmp_path,
    )
    workers.start("default", CPU_QUEUES, "threads")
    workers.start_gpu()
    try:
        api = api_servers.start(
            database_url=_database_url(), workers=1, REDIS_URL=redis_url, CELERY_BROKER_URL=redis_url
        )
        base = base_model_register(name="base", path=tiny_starter_model)
        clients = {}
        for name in ("burst", "manual"):
            tenant = make_tenant(f"{name}-{uuid.uuid4().hex[:6]}")
            adapter = adapter_create(tenant, name="tab", base_model=base, is_default=True)
            TrainingPolicy.objects.create(
                tenant=tenant,
                adapter=adapter,
                min_new_events=12,
                max_wait_s=10**6,
                trainer_overrides={"no_such_option": 1},
            )
            raw_key = make_client(tenant, scopes=["ingest", "feedback", "admin"]).raw_key
            clients[name] = (_Api(api.url, raw_key), adapter)
        yield api, workers, clients
    finally:
        workers.stop_all()


def _log_count(path: Path, text: str) -> int:
    return path.read_text(errors="replace").count(text)


def test_ingest_goes_on_while_redis_restarts_and_the_sweepers_recover_the_lost_work(stack, private_redis):
    api, workers, clients = stack
    burst, burst_adapter = clients["burst"]
    manual, manual_adapter = clients["manual"]
    response, _ = burst.call("GET", "/v1/tenant")  # Redis up: counted, and the API's connections are made
    assert response.status_code == 200

    private_redis.stop()

    # Ingest goes on: a batch of interactions, then feedback one by one (each would ask for a check).
    items = [
        {"client_id": f"b-{i}", "prompt": f"x{i} = ", "completion": "1", "end_user_id": "dev-1", "opted_in": True}
        for i in range(12)
    ]
    response, took = burst.call("POST", "/v1/interactions", {"items": items})
    assert response.status_code == 207 and response.json()["created"] == 12, response.text
    assert took < QUICK_S, f"a batch while Redis is down took {took:.1f} s"
    for i in range(12):
        response, took = burst.call("POST", "/v1/feedback", {"client_id": f"b-{i}", "outcome": "accepted"})
        assert response.status_code == 200, response.text
        assert took < QUICK_S, f"feedback while Redis is down took {took:.1f} s"

    # A run started by hand is recorded; its message cannot be sent, and the request does not wait for long.
    response, took = manual.call("POST", "/v1/adapters/tab/training-runs")
    assert response.status_code == 202, response.text
    assert took < QUICK_S, f"starting a run while Redis is down took {took:.1f} s"
    lost_run = TrainingRun.objects.get(adapter=manual_adapter)
    assert lost_run.status == "queued"

    # Rate limits failed open, and said so once, not once per request. (Burst's requests were served
    # from the block of its budget the process took before the stop; manual's first request needed
    # a block of its own and found Redis gone.)
    assert _log_count(api.log_path, FAIL_OPEN_LINE) == 1, api.log_tail()

    private_redis.start()  # empty: every queued message and counter is gone

    # Beat's scheduler finds the run the lost feedback checks would have started.
    assert not TrainingRun.objects.filter(adapter=burst_adapter).exists()
    _send_as_beat(private_redis.url(), "workers.training.training_schedule_all")
    run = wait_until(
        lambda: TrainingRun.objects.filter(adapter=burst_adapter).exclude(status="queued").first(),
        timeout=180,
        what="beat's scheduler to start the burst's run and the gpu worker to take it",
        workers=workers,
    )
    assert run.trigger == "12 new events"

    # The run whose message Redis lost is still queued (the gpu worker is taking work again) ...
    lost_run.refresh_from_db()
    assert lost_run.status == "queued"
    # ... until the sweeper sends it again, once it has waited as long as beat's sweeper waits.
    sent_long_ago = timezone.now() - timedelta(minutes=2)
    TrainingRun.objects.filter(pk=lost_run.pk).update(created_at=sent_long_ago, dispatched_at=sent_long_ago)
    _send_as_beat(private_redis.url(), "workers.training.training_sweep_queued")
    wait_until(
        lambda: TrainingRun.objects.filter(pk=lost_run.pk, status="failed").exists(),
        timeout=180,
        what="the sweeper to send the lost run again and the gpu worker to run it",
        workers=workers,
    )
    lost_run.refresh_from_db()
    assert lost_run.attempt == 1 and "no events" in lost_run.error, lost_run.error

    # The API publishes again (its broker connection was replaced) ...
    response, _ = manual.call("POST", "/v1/adapters/tab/training-runs")
    assert response.status_code == 202, response.text
    wait_until(
        lambda: TrainingRun.objects.filter(adapter=manual_adapter, status="queued").count() == 0,
        timeout=180,
        what="a run started after the restart to be taken by the gpu worker",
        workers=workers,
    )

    # ... and counts requests again, once it has asked Redis again (when a tenant needs a new block).
    def enforced_again() -> bool:
        assert burst.call("GET", "/v1/tenant")[0].status_code == 200
        return _log_count(api.log_path, ENFORCED_AGAIN_LINE) == 1

    wait_until(enforced_again, timeout=60, what="rate limits to be enforced again")
    assert private_redis.client().keys("strop:rl:*")
    assert _log_count(api.log_path, FAIL_OPEN_LINE) == 1


def test_a_hung_redis_costs_a_request_at_most_about_a_second(private_redis, settings, caplog):
    """SIGSTOP: connections open, nothing answers. The rate limit waits for its short timeout once
    and then skips Redis; a publish gives up after about a second."""
    from kombu.exceptions import OperationalError

    from apps.common.exceptions import RateLimited
    from apps.tenants import ratelimit
    from apps.tenants.models import Tenant

    settings.REDIS_URL = private_redis.url()
    tenant = Tenant(pk=10**9, slug="hung", rate_limit_per_minute=1)
    ratelimit.redis_outage.__init__()  # this process's view of Redis, fresh for this test
    assert private_redis.proc is not None
    private_redis.proc.send_signal(signal.SIGSTOP)
    try:
        started = time.monotonic()
        served = 0
        for _ in range(50):  # far over the limit of 1: this process counts alone and refuses past it
            try:
                ratelimit.rate_limit_check(tenant)
                served += 1
            except RateLimited:
                pass
        took = time.monotonic() - started
        assert 1 <= served <= 2  # one a minute (two if the checks straddle a minute)
        assert took < 3, f"50 rate-limit checks against a hung Redis took {took:.1f} s"  # 12.5 s uncut
        assert sum(FAIL_OPEN_LINE in r.getMessage() for r in caplog.records) == 1

        outcome: list[object] = []

        def publish() -> None:
            started = time.monotonic()
            try:
                _send_as_beat(private_redis.url(), "workers.training.training_schedule_all")
                outcome.append("sent")
            except OperationalError:
                outcome.append(time.monotonic() - started)

        thread = threading.Thread(target=publish, daemon=True)
        thread.start()
        thread.join(timeout=30)
        assert outcome, "a publish to a hung Redis did not give up within 30 s"
        assert isinstance(outcome[0], float) and outcome[0] < PUBLISH_S, outcome
    finally:
        private_redis.proc.send_signal(signal.SIGCONT)
        ratelimit.redis_outage.__init__()
