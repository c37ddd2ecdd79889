"""What a tenant reads when something fails: no traceback, host, URL or path. Those go to the
operator's log, on a line that carries the request id the tenant can quote."""

from __future__ import annotations

import logging
import socket

import httpx
import pytest
from django.contrib.auth import get_user_model
from django.urls import path, reverse
from rest_framework.response import Response

from apps.adapters.services import adapter_create, base_model_register
from apps.common.apis import ScopedApi
from apps.engines.vllm_errors import AdapterRejected, VLLMUnavailable, raise_for
from apps.interactions.models import ServingFailure
from apps.tenants.services import membership_create
from apps.training.models import TrainingRun
from config.urls import urlpatterns as project_urlpatterns

pytestmark = pytest.mark.django_db

SECRET_BITS = ("db.internal", "5432", "/srv/strop", "Traceback", "settings.py")


class BoomApi(ScopedApi):
    required_scope = "any"

    def get(self, request) -> Response:
        raise RuntimeError("could not reach db.internal:5432 reading /srv/strop/config/settings.py")


def boom_page(request):
    raise RuntimeError("could not reach db.internal:5432 reading /srv/strop/config/settings.py")


# This module is the URLconf of the tests marked with it: the project's routes, and two that fail.
urlpatterns = [path("v1/boom", BoomApi.as_view()), path("dashboard/boom/", boom_page), *project_urlpatterns]
handler500 = "apps.common.apis.server_error"


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed again on leaving: a connection to it is refused


@pytest.fixture
def adapter(tenant, tiny_starter_model):
    base = base_model_register(name="starter-tiny", path=tiny_starter_model)
    return adapter_create(tenant, name="autocomplete", base_model=base, is_default=True)


@pytest.mark.urls(__name__)
def test_a_500_answers_only_a_generic_message_and_the_request_id(client_a, caplog):
    client_a.raise_request_exception = False
    with caplog.at_level(logging.ERROR):
        response = client_a.get("/v1/boom", HTTP_X_REQUEST_ID="req-500-check")
    assert response.status_code == 500
    assert response["X-Request-ID"] == "req-500-check"
    error = response.json()["error"]
    assert error == {
        "code": "server_error",
        "type": "server_error",
        "param": None,
        "message": "the server failed; the operator's log holds the details under request id req-500-check",
        "details": {"request_id": "req-500-check"},
    }
    assert not any(bit in response.content.decode() for bit in SECRET_BITS)
    # The operator's log has the error itself, with its traceback.
    assert any(r.exc_info and "db.internal:5432" in str(r.exc_info[1]) for r in caplog.records)


@pytest.mark.urls(__name__)
def test_a_dashboard_500_page_shows_the_request_id_and_nothing_of_the_error(client):
    client.raise_request_exception = False
    response = client.get("/dashboard/boom/", HTTP_X_REQUEST_ID="req-page-500")
    assert response.status_code == 500
    page = response.content.decode()
    assert "req-page-500" in page
    assert not any(bit in page for bit in SECRET_BITS)


def test_a_vllm_failure_answered_to_the_tenant_names_no_replica(adapter, client_a, settings, caplog):
    replicas = [f"http://127.0.0.1:{closed_port()}", f"http://127.0.0.1:{closed_port()}"]
    settings.VLLM_BASE_URLS = replicas
    with caplog.at_level(logging.INFO):
        response = client_a.post(
            "/v1/completions",
            {"model": "autocomplete", "prompt": "def f():"},
            format="json",
            HTTP_X_REQUEST_ID="req-vllm-down",
        )
    assert response.status_code == 503
    body = response.content.decode()
    assert response.json()["error"]["code"] == "vllm_unavailable"
    assert "replica" not in response.json()["error"]["details"]
    assert "127.0.0.1" not in body and not any(replica in body for replica in replicas)
    assert not any(str(port) in body for port in (r.rsplit(":", 1)[1] for r in replicas))
    # The failure kept for the error-rate guardrail reads the same.
    failure = ServingFailure.objects.get()
    assert "127.0.0.1" not in failure.message
    # The operator's log has vLLM's failure, on a line with the request id.
    logged = [r for r in caplog.records if r.name == "apps.engines.vllm_errors"]
    assert logged and "Connection refused" in logged[-1].getMessage()
    assert getattr(logged[-1], "request_id", None) == "req-vllm-down"


def test_a_replicas_url_and_an_adapters_path_stay_in_the_operators_log(caplog):
    replica = "http://vllm-7.internal:8100"
    answer = httpx.Response(
        503,
        json={"error": {"message": "engine dead at /srv/models/base/model.safetensors", "type": "x", "code": 503}},
        request=httpx.Request("POST", f"{replica}/v1/completions"),
    )
    with caplog.at_level(logging.INFO), pytest.raises(VLLMUnavailable) as unavailable:
        raise_for(answer, replica, what="completion")
    assert unavailable.value.as_dict() == {
        "code": "vllm_unavailable",
        "type": "server_error",
        "param": None,
        "message": "vLLM completion at <url>: engine dead at <path>",
        "details": {},
    }
    rejected = AdapterRejected(
        "No adapter found for /srv/adapters/t1/v3",
        replica=replica,
        vllm_status=404,
        details={"lora_name": "t1-a1-v3", "lora_path": "/srv/adapters/t1/v3"},
    )
    shown = rejected.as_dict()
    assert shown["message"] == "No adapter found for <path>"
    assert shown["details"] == {"vllm_status": 404, "vllm_type": None, "lora_name": "t1-a1-v3"}
    operator_lines = " ".join(r.getMessage() for r in caplog.records if r.name == "apps.engines.vllm_errors")
    assert replica in operator_lines and "/srv/adapters/t1/v3" in operator_lines


def test_a_failed_runs_error_shows_one_line_without_paths_in_the_api_and_the_dashboard(adapter, make_client, client):
    run = TrainingRun.objects.create(
        tenant=adapter.tenant,
        adapter=adapter,
        status=TrainingRun.Status.FAILED,
        error=(
            "FileNotFoundError: [Errno 2] No such file or directory: '/srv/strop/adapters/t1/v3/config.json'\n\n"
            'Traceback (most recent call last):\n  File "/srv/strop/apps/training/pipeline.py", line 80\n'
        ),
    )
    api = make_client(adapter.tenant, scopes=["admin"])
    shown = api.get(f"/v1/training-runs/{run.pk}").json()["error"]
    assert shown == "FileNotFoundError: [Errno 2] No such file or directory: '<path>'"

    user = get_user_model().objects.create_user(username="admin-1", password="x" * 20)
    membership_create(adapter.tenant, user=user, role="admin")
    client.force_login(user)
    page = client.get(reverse("dashboard:run-detail", kwargs={"tenant_slug": adapter.tenant.slug, "run_id": run.pk}))
    assert page.status_code == 200
    html = page.content.decode()
    assert "No such file or directory" in html
    assert "/srv/strop" not in html and "Traceback" not in html
