"""Deliveries run on the ``webhooks`` queue, which every way of starting Strop's workers consumes
(a queue no worker takes is never run), with time limits, acks_late and a capped backoff; and a
claim left by a worker that died is taken over once its lease has lapsed."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from apps.notifications.models import WebhookDelivery
from apps.notifications.services import (
    notification_send,
    retry_backoff_s,
    webhook_create,
    webhook_deliver,
    webhook_deliveries_resend,
    webhook_delivery_claim,
)
from apps.notifications.services.deliveries import claim_lease_s
from tests.fixtures.workers import CPU_QUEUES

ROOT = Path(__file__).resolve().parents[2]
QUEUE_FLAG = re.compile(r"celery -A config (?:-q )?worker -Q (\S+)")


def _queues() -> set[str]:
    return {q.name for q in django_settings.CELERY_TASK_QUEUES}


def _taken(text: str) -> set[str]:
    return {queue for match in QUEUE_FLAG.findall(text) for queue in match.strip('"').split(",")}


def test_deliveries_are_routed_to_the_webhooks_queue():
    from config.celery import app

    for task in ("workers.notifications.webhook_deliver", "workers.notifications.webhook_deliveries_resend"):
        assert app.amqp.router.route({}, task)["queue"].name == "webhooks"
    assert "webhooks" in _queues()


@pytest.mark.parametrize(
    "definition", ["platform/Procfile", "platform/demo-processes.sh"], ids=["procfile", "demo-processes"]
)
def test_every_process_definition_consumes_every_queue(definition):
    assert _queues() - _taken((ROOT / definition).read_text()) == set()


def test_the_test_workers_consume_every_queue():
    assert _queues() - {"gpu", *CPU_QUEUES.split(",")} == set()


def test_the_delivery_task_has_time_limits_and_is_acknowledged_after_it_runs():
    import workers.notifications as tasks

    task = tasks.webhook_deliver
    assert task.acks_late and task.reject_on_worker_lost
    assert django_settings.STROP_WEBHOOK_TIMEOUT_S < task.soft_time_limit < task.time_limit < claim_lease_s()
    procfile = (ROOT / "platform" / "Procfile").read_text()
    assert re.search(r"^worker-webhooks: .*-Q webhooks --pool prefork ", procfile, re.MULTILINE)  # limits hold


def test_the_backoff_grows_exponentially_up_to_its_cap(settings):
    settings.STROP_WEBHOOK_RETRY_BASE_S, settings.STROP_WEBHOOK_RETRY_MAX_S = 10, 7200
    assert [retry_backoff_s(n) for n in range(1, 8)] == [10, 50, 250, 1250, 6250, 7200, 7200]


@pytest.mark.django_db
def test_a_dead_workers_claim_is_taken_over_after_its_lease_and_counts_as_an_attempt(
    make_tenant, receiver, local_endpoints, settings
):
    settings.STROP_WEBHOOK_MAX_ATTEMPTS = 2
    endpoint = receiver([])
    tenant = make_tenant("hooks-lease")
    webhook_create(tenant, url=endpoint.url, events=["run.failed"], actor="test")
    [delivery] = notification_send(tenant, event="run.failed", data={})
    assert webhook_delivery_claim(delivery.pk) is not None  # a worker claims it, then dies (no outcome)

    assert webhook_deliver(delivery.pk).status == "skipped"  # its claim still holds
    assert webhook_deliveries_resend() == []
    lapsed = timezone.now() - timedelta(seconds=claim_lease_s() + 1)
    WebhookDelivery.objects.filter(pk=delivery.pk).update(claimed_at=lapsed)
    assert webhook_deliveries_resend() == [delivery.pk]  # beat sends it again

    assert webhook_deliver(delivery.pk).status == "delivered"
    delivery.refresh_from_db()
    assert (delivery.attempts, len(endpoint.received)) == (2, 1)


@pytest.mark.django_db
def test_a_dead_workers_claim_on_the_last_attempt_ends_the_delivery_failed(
    make_tenant, receiver, local_endpoints, settings
):
    settings.STROP_WEBHOOK_MAX_ATTEMPTS = 1
    endpoint = receiver([])
    tenant = make_tenant("hooks-lease-last")
    webhook_create(tenant, url=endpoint.url, events=["run.failed"], actor="test")
    [delivery] = notification_send(tenant, event="run.failed", data={})
    assert webhook_delivery_claim(delivery.pk) is not None
    lapsed = timezone.now() - timedelta(seconds=claim_lease_s() + 1)
    WebhookDelivery.objects.filter(pk=delivery.pk).update(claimed_at=lapsed)

    assert webhook_deliver(delivery.pk).status == "skipped"

    delivery.refresh_from_db()
    assert (delivery.status, delivery.error) == ("failed", "the worker stopped during the last attempt")
    assert endpoint.received == []


@pytest.mark.django_db
def test_an_attempt_stopped_by_the_time_limit_is_recorded_and_retried(make_tenant, receiver, local_endpoints):
    from celery.exceptions import SoftTimeLimitExceeded

    endpoint = receiver([])
    tenant = make_tenant("hooks-soft-limit")
    url = endpoint.url.replace("127.0.0.1", "hooks.slow.test")  # a name, so the resolver runs
    webhook_create(tenant, url=url, events=["run.failed"], actor="test")
    [delivery] = notification_send(tenant, event="run.failed", data={})

    def slow_resolver(host: str, port: int) -> list[str]:
        raise SoftTimeLimitExceeded()  # what Celery raises in the task when its soft limit passes

    with pytest.raises(SoftTimeLimitExceeded):
        webhook_deliver(delivery.pk, resolver=slow_resolver)

    delivery.refresh_from_db()
    assert (delivery.status, delivery.attempts, delivery.claimed_at) == ("pending", 1, None)
    assert delivery.error == "the attempt stopped: SoftTimeLimitExceeded"
    assert delivery.next_attempt_at is not None and endpoint.received == []
