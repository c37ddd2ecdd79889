"""What operators see: /metrics (guarded, every process's counters added up, values read at
scrape) and JSON log lines whose request id follows a request into its Celery tasks."""

from __future__ import annotations

import io
import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.conf import settings as django_settings
from prometheus_client.parser import text_string_to_metric_families

from apps.adapters.models import Adapter, AdapterVersion, BaseModel
from apps.common.observability.logs import JsonFormatter
from apps.interactions.models import Feedback
from apps.training.models import TrainingRun
from tests.fixtures.workers import wait_until

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(client: Any, **extra: Any) -> Samples:
    """GET /metrics and parse it with prometheus_client's own parser (a malformed line raises)."""
    response = client.get("/metrics", **extra)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    samples: Samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def interaction(client_id: str) -> dict[str, Any]:
    return {"client_id": client_id, "prompt": "def f():\n    ", "completion": "return 1"}


# ---------------------------------------------------------------- the guard


@pytest.mark.django_db
def test_metrics_refuse_a_remote_caller_when_no_token_is_set(client, settings):
    settings.STROP_METRICS_TOKEN = ""
    response = client.get("/metrics", REMOTE_ADDR="203.0.113.7")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "permission_denied"
    assert "STROP_METRICS_TOKEN" in response.json()["error"]["message"]
    assert b"strop_" not in response.content


@pytest.mark.django_db
def test_metrics_refuse_a_loopback_caller_that_came_through_a_proxy(client, settings):
    settings.STROP_METRICS_TOKEN = ""
    assert client.get("/metrics", HTTP_X_FORWARDED_FOR="203.0.113.7").status_code == 403
    assert client.get("/metrics", HTTP_FORWARDED="for=203.0.113.7").status_code == 403


@pytest.mark.django_db
def test_metrics_serve_a_direct_loopback_caller_when_no_token_is_set(client, settings):
    settings.STROP_METRICS_TOKEN = ""
    assert scrape(client, REMOTE_ADDR="127.0.0.1")
    assert scrape(client, REMOTE_ADDR="::1")


@pytest.mark.django_db
def test_metrics_with_a_token_serve_only_callers_that_send_it(client, settings):
    settings.STROP_METRICS_TOKEN = "s3cret-metrics-token"
    remote = "198.51.100.4"
    missing = client.get("/metrics", REMOTE_ADDR=remote)
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "not_authenticated"
    assert missing["WWW-Authenticate"].startswith("Bearer")
    assert client.get("/metrics", REMOTE_ADDR=remote, HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert client.get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 401  # loopback too
    assert scrape(client, REMOTE_ADDR=remote, HTTP_AUTHORIZATION="Bearer s3cret-metrics-token")


@pytest.mark.django_db
def test_metrics_answer_other_methods_with_a_json_405(client):
    response = client.post("/metrics")
    assert response.status_code == 405 and response.json()["error"]["code"] == "method_not_allowed"


# ---------------------------------------------------------------- counters


@pytest.mark.django_db
def test_an_ingest_request_moves_its_route_tenant_and_row_counters(client, client_a):
    before = scrape(client)
    batch = {"items": [interaction("m-1"), interaction("m-2"), {"client_id": "m-3", "prompt": 42, "completion": "x"}]}
    assert client_a.post("/v1/interactions", batch, format="json").status_code == 207
    assert client_a.post("/v1/interactions", interaction("m-1"), format="json").status_code == 200  # a replay
    feedback = {"items": [{"client_id": "m-1", "outcome": "accepted"}, {"client_id": "m-2", "outcome": "maybe"}]}
    assert client_a.post("/v1/feedback", feedback, format="json").status_code == 207
    after = scrape(client)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    requests = "strop_http_requests_total"
    assert moved(requests, route="interactions", method="POST", status="207", tenant="acme") == 1
    assert moved(requests, route="interactions", method="POST", status="200", tenant="acme") == 1
    assert moved(requests, route="feedback", method="POST", status="207", tenant="acme") == 1
    assert moved("strop_http_request_duration_seconds_count", route="interactions", method="POST") == 2
    assert moved("strop_http_request_duration_seconds_bucket", route="interactions", method="POST", le="+Inf") == 2
    assert moved("strop_ingest_accepted_total", kind="interactions", tenant="acme") == 2
    assert moved("strop_ingest_duplicates_total", kind="interactions", tenant="acme") == 1
    assert moved("strop_ingest_rejected_total", kind="interactions", reason="invalid") == 1
    assert moved("strop_ingest_accepted_total", kind="feedback", tenant="acme") == 1
    assert moved("strop_ingest_rejected_total", kind="feedback", reason="invalid") == 1


@pytest.mark.django_db
def test_route_labels_are_url_pattern_names_never_raw_paths(client, client_a):
    interaction_id = client_a.post("/v1/interactions", interaction("p-1"), format="json").json()["id"]
    assert client_a.get(f"/v1/interactions/{interaction_id}").status_code == 200
    unknown = f"/no/such/{uuid.uuid4().hex}"
    assert client.get(unknown).status_code == 404
    samples = scrape(client)
    labels = {dict(key).get("route") for _, key in samples}
    assert {"interaction-detail", "unmatched"} <= labels
    assert not any(interaction_id in str(key) or unknown in str(key) for key in samples)
    requests = "strop_http_requests_total"
    assert value(samples, requests, route="interaction-detail", method="GET", status="200", tenant="acme") >= 1
    assert value(samples, requests, route="unmatched", method="GET", status="404", tenant="") >= 1


@pytest.mark.django_db
def test_an_invented_http_method_is_counted_as_other(client):
    client.generic("BREW", "/health")
    samples = scrape(client)
    assert value(samples, "strop_http_requests_total", route="health", method="other", status="405", tenant="") >= 1
    assert not any(dict(key).get("method") == "BREW" for _, key in samples)


@pytest.mark.django_db
def test_an_adapter_load_with_vllm_unreachable_is_counted_unavailable(client, settings, tenant):
    from apps.adapters.loading import adapter_version_load
    from apps.engines.vllm_client import VLLMUnavailable

    settings.VLLM_BASE_URLS = ["http://127.0.0.1:9"]
    base = BaseModel.objects.create(name="obs-base", path="/nonexistent", family="qwen")
    adapter = Adapter.objects.create(tenant=tenant, name="obs", base_model=base)
    version = AdapterVersion.objects.create(
        tenant=tenant, adapter=adapter, number=1, artifact_path="/nonexistent/v1", vllm_name="acme--obs--v1"
    )
    before = value(scrape(client), "strop_adapter_loads_total", outcome="unavailable")
    with pytest.raises(VLLMUnavailable):
        adapter_version_load(version_id=version.pk)
    assert value(scrape(client), "strop_adapter_loads_total", outcome="unavailable") == before + 1


@pytest.mark.django_db
def test_a_finished_training_run_observes_the_durations_of_its_stages(client, settings, tenant, tiny_starter_model):
    from apps.adapters.services import adapter_create, base_model_register
    from apps.interactions.services import feedback_ingest, interactions_ingest
    from apps.training.models import TrainingPolicy
    from apps.training.pipeline import training_run_execute

    settings.TRAINING_HEARTBEAT_S = 3600  # no heartbeat from another connection into this test's transaction
    base = base_model_register(name="obs-train-base", path=tiny_starter_model)
    adapter = adapter_create(tenant, name="obs-train", base_model=base, is_default=True)
    # Exported, then the trainer refuses its configuration: a run that ends failed after one stage.
    TrainingPolicy.objects.create(tenant=tenant, adapter=adapter, trainer_overrides={"no_such_option": 1})
    events = [
        {
            **interaction(f"t-{i}"),
            "prompt_token_ids": [5, 6, 7],
            "completion_token_ids": [8, 9],
            "end_user_id": "dev-1",
            "opted_in": True,
        }
        for i in range(8)
    ]
    interactions_ingest(tenant, items=events)
    feedback_ingest(tenant, items=[{"client_id": f"t-{i}", "outcome": "accepted"} for i in range(8)])
    run = TrainingRun.objects.create(tenant=tenant, adapter=adapter)
    before = scrape(client)
    assert training_run_execute(run.pk, attempt=run.attempt) == "failed"
    run.refresh_from_db()
    assert set(run.stage_seconds) == {"export"} and "no_such_option" in run.error
    after = scrape(client)
    count = "strop_training_stage_seconds_count"
    assert value(after, count, stage="export") == value(before, count, stage="export") + 1
    assert value(after, count, stage="train") == value(before, count, stage="train")
    total = "strop_training_stage_seconds_sum"
    assert value(after, total, stage="export") - value(before, total, stage="export") == pytest.approx(
        run.stage_seconds["export"]
    )


# ---------------------------------------------------------------- read at scrape


@pytest.mark.django_db
def test_pending_feedback_gauge_equals_the_database_count(client, make_tenant, make_client):
    one, two = make_client(make_tenant("pending-one")), make_client(make_tenant("pending-two"))
    early = {"items": [{"client_id": f"later-{i}", "outcome": "accepted"} for i in range(3)]}
    assert one.post("/v1/feedback", early, format="json").status_code == 207
    assert two.post("/v1/feedback", {"client_id": "later-x", "outcome": "rejected"}, format="json").status_code == 202
    assert one.post("/v1/interactions", interaction("later-0"), format="json").status_code == 201  # attaches one
    samples = scrape(client)
    for api in (one, two):
        expected = Feedback.objects.filter(tenant=api.tenant, pending_client_id__isnull=False).count()
        assert value(samples, "strop_feedback_pending", tenant=api.tenant.slug) == expected
    assert value(samples, "strop_feedback_pending", tenant="pending-one") == 2
    total = sum(v for (name, _), v in samples.items() if name == "strop_feedback_pending")
    assert total == Feedback.objects.filter(pending_client_id__isnull=False).count()
    assert value(samples, "strop_scrape_source_up", source="database") == 1


@pytest.mark.django_db
def test_training_runs_appear_by_state(client, tenant):
    base = BaseModel.objects.create(name="obs-runs-base", path="/nonexistent", family="qwen")
    states = ["failed", "failed", "candidate", "queued"]
    for index, state in enumerate(states):  # one active run per adapter: each run its own adapter
        adapter = Adapter.objects.create(tenant=tenant, name=f"runs-{index}", base_model=base)
        TrainingRun.objects.create(tenant=tenant, adapter=adapter, status=state)
    samples = scrape(client)
    for state in TrainingRun.Status.values:
        assert value(samples, "strop_training_runs", state=state) == TrainingRun.objects.filter(status=state).count()
    assert value(samples, "strop_training_runs", state="failed") == 2
    assert ("strop_training_runs", frozenset({("state", "exporting")})) in samples  # zero, but present


@pytest.mark.django_db
def test_queue_depth_is_the_length_of_each_redis_queue(client):
    from config.celery import app

    app.control.purge()
    try:
        app.send_task("workers.ingest.feedback_attach_pending_all", queue="default")
        samples = scrape(client)
        broker = redis.Redis.from_url(django_settings.CELERY_BROKER_URL)
        assert value(samples, "strop_celery_queue_length", queue="default") == broker.llen("default") >= 1
        assert ("strop_celery_queue_length", frozenset({("queue", "gpu")})) in samples
        assert value(samples, "strop_scrape_source_up", source="broker") == 1
    finally:
        app.control.purge()


@pytest.mark.django_db
def test_an_unreachable_broker_reads_down_and_the_rest_of_the_scrape_answers(client, settings):
    settings.CELERY_BROKER_URL = "redis://127.0.0.1:1/0"
    samples = scrape(client)
    assert value(samples, "strop_scrape_source_up", source="broker") == 0
    assert value(samples, "strop_scrape_source_up", source="database") == 1
    assert not any(name == "strop_celery_queue_length" for name, _ in samples)
    assert ("strop_training_runs", frozenset({("state", "queued")})) in samples


@pytest.mark.django_db
def test_the_filesystem_broker_has_no_queue_depth(client, settings):
    settings.CELERY_BROKER_URL = "filesystem://"
    samples = scrape(client)
    assert not any(name == "strop_celery_queue_length" for name, _ in samples)
    assert ("strop_scrape_source_up", frozenset({("source", "broker")})) not in samples


@pytest.mark.django_db
def test_an_unreachable_vllm_replica_reads_down(client, settings):
    settings.VLLM_BASE_URLS = ["http://127.0.0.1:9"]
    samples = scrape(client)
    assert value(samples, "strop_vllm_replica_up", replica="http://127.0.0.1:9") == 0
    assert ("strop_vllm_replica_up", frozenset({("replica", "http://127.0.0.1:9")})) in samples


@pytest.mark.vllm
@pytest.mark.django_db
def test_a_running_vllm_replica_reads_up_and_a_refused_adapter_load_is_counted(client, served, tenant):
    from apps.adapters.loading import adapter_version_load

    samples = scrape(client)
    assert value(samples, "strop_vllm_replica_up", replica=served.base_url) == 1
    base = BaseModel.objects.create(name="obs-vllm-base", path=str(served.model_dir), family="qwen")
    adapter = Adapter.objects.create(tenant=tenant, name="obs-refused", base_model=base)
    version = AdapterVersion.objects.create(
        tenant=tenant, adapter=adapter, number=1, artifact_path="/nonexistent/v1", vllm_name="acme--obs--v1-x"
    )
    before = value(samples, "strop_adapter_loads_total", outcome="rejected")
    assert adapter_version_load(version_id=version.pk) == "failed"
    assert value(scrape(client), "strop_adapter_loads_total", outcome="rejected") == before + 1


# ---------------------------------------------------------------- request ids and logs


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """What the configured console handler (LOG_FORMAT=json by default) writes during the test."""
    handler = next(h for h in logging.getLogger().handlers if h.name == "console")
    assert isinstance(handler.formatter, JsonFormatter)
    stream = io.StringIO()
    previous = handler.setStream(stream)
    try:
        yield stream
    finally:
        handler.setStream(previous)


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


@pytest.mark.django_db
def test_a_request_id_is_echoed_and_on_the_requests_json_log_line(client_a, json_log):
    response = client_a.post("/v1/interactions", interaction("log-1"), format="json", HTTP_X_REQUEST_ID="req-42.a:b")
    assert response.status_code == 201 and response["X-Request-ID"] == "req-42.a:b"
    lines = [entry for entry in json_lines(json_log.getvalue()) if entry["request_id"] == "req-42.a:b"]
    access = next(entry for entry in lines if entry["logger"] == "strop.request")
    assert access["tenant"] == "acme" and access["route"] == "interactions" and access["status"] == 201
    assert access["level"] == "INFO" and access["time"].endswith("+00:00")
    assert access["message"].startswith("POST /v1/interactions 201")


@pytest.mark.django_db
def test_a_request_without_an_id_gets_a_fresh_one(client):
    first, second = client.get("/health")["X-Request-ID"], client.get("/health")["X-Request-ID"]
    assert first != second and len(first) == 32 and int(first, 16) >= 0


@pytest.mark.django_db
@pytest.mark.parametrize("unsafe", ["evil\nforged log line", "x" * 500, "", "a b", 'quote"d', "ünïcode"])
def test_an_unsafe_incoming_request_id_is_replaced(client, json_log, unsafe):
    response = client.get("/v1/tenant", HTTP_X_REQUEST_ID=unsafe)  # 401, logged at INFO
    replaced = response["X-Request-ID"]
    assert replaced != unsafe and len(replaced) == 32 and int(replaced, 16) >= 0
    (access,) = [e for e in json_lines(json_log.getvalue()) if e["logger"] == "strop.request"]
    assert access["request_id"] == replaced and access["status"] == 401
    if unsafe:
        assert unsafe not in json_log.getvalue()


@pytest.mark.django_db
def test_an_error_log_line_carries_the_request_id_and_the_exception(json_log):
    from apps.common.observability import context

    bound = context.bind(request_id="err-1", tenant="acme")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logging.getLogger("strop.test").exception("it failed")
    finally:
        context.unbind(bound)
    (entry,) = [e for e in json_lines(json_log.getvalue()) if e["logger"] == "strop.test"]
    assert entry["request_id"] == "err-1" and entry["tenant"] == "acme" and entry["level"] == "ERROR"
    assert entry["message"] == "it failed" and "RuntimeError: boom" in entry["exception"]


def test_the_plain_format_shows_the_request_id_and_tenant_when_there_are_some():
    from apps.common.observability import context
    from apps.common.observability.logs import ContextFilter, PlainFormatter

    def line(message: str) -> str:
        record = logging.LogRecord("strop.test", logging.WARNING, __file__, 1, message, (), None)
        ContextFilter().filter(record)
        return PlainFormatter().format(record)

    bound = context.bind(request_id="req-7", tenant="acme")
    try:
        assert line("inside").endswith(" WARNING strop.test [req-7 acme]: inside")
    finally:
        context.unbind(bound)
    assert line("outside").endswith(" WARNING strop.test: outside")


@pytest.mark.django_db
def test_an_eager_task_keeps_the_request_id_of_the_request_it_runs_in(tenant, json_log):
    from apps.common.observability import context
    from workers.training import training_schedule_tenant

    bound = context.bind(request_id="eager-1", tenant="acme")
    try:
        training_schedule_tenant.apply(args=[tenant.pk])
        assert context.current_request_id() == "eager-1" and context.task_var.get() is None
    finally:
        context.unbind(bound)
    traced = [e for e in json_lines(json_log.getvalue()) if e["logger"] == "celery.app.trace"]
    assert traced and all(e["request_id"] == "eager-1" and e["task"] for e in traced)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_request_id_follows_a_request_into_the_celery_task_it_enqueued(celery_workers, make_tenant, make_client):
    from django.test import Client

    api = make_client(make_tenant(f"obs-{uuid.uuid4().hex[:6]}"))
    assert api.post("/v1/interactions", interaction("w-1"), format="json").status_code == 201
    scraper = Client()
    task = "workers.training.training_schedule_tenant"
    before = value(scrape(scraper), "strop_celery_tasks_total", task=task, outcome="succeeded")
    request_id = f"obs-{uuid.uuid4().hex}"
    # Feedback on a stored interaction asks the scheduler for a check: a task on the default queue.
    response = api.post(
        "/v1/feedback", {"client_id": "w-1", "outcome": "accepted"}, format="json", HTTP_X_REQUEST_ID=request_id
    )
    assert response.status_code == 200 and response["X-Request-ID"] == request_id

    def task_line() -> dict[str, Any] | None:
        log = (celery_workers.log_dir / "default.log").read_text(errors="replace")
        return next(
            (e for e in json_lines(log) if e.get("request_id") == request_id and "succeeded" in e["message"]), None
        )

    entry = wait_until(task_line, timeout=90, what="the task's log line with the request id", workers=celery_workers)
    assert isinstance(entry, dict)
    assert entry["task"] == task and entry["tenant"] == api.tenant.slug and entry["task_id"]
    # The worker is another process: its counter reaches /metrics through the shared folder.
    wait_until(
        lambda: value(scrape(scraper), "strop_celery_tasks_total", task=task, outcome="succeeded") >= before + 1,
        timeout=30,
        what="the worker's task counter in /metrics",
        workers=celery_workers,
    )
