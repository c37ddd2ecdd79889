"""vLLM behind a key: the session's vLLM requires one on every route but the health probes (vLLM's
own ``--api-key`` check leaves ``/invocations`` and ``/adapters`` open; platform/vllm.sh closes
them), and Strop sends it on every call to it."""

from __future__ import annotations

import httpx
import pytest

from apps.engines.vllm import vllm_client
from apps.interactions.models import Interaction

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True)]

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.fixture
def keyed(served):
    if not served.api_key:
        pytest.skip("the reused vLLM server (STROP_TEST_VLLM_URL) has no STROP_TEST_VLLM_API_KEY")
    return served


def test_the_suite_starts_vllm_with_a_key_that_strops_settings_carry(keyed, settings):
    assert len(keyed.api_key) >= 32
    assert settings.VLLM_API_KEY == keyed.api_key


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer not-the-key"}], ids=["no-key", "wrong-key"])
def test_vllm_refuses_every_route_that_serves_or_loads_without_the_key(keyed, make_lora_adapter, headers):
    adapter_dir = str(make_lora_adapter(seed=11))
    calls = [
        ("GET", "/v1/models", None),
        ("POST", "/v1/completions", {"model": keyed.served_model_name, "prompt": "def f(", "max_tokens": 2}),
        ("POST", "/v1/chat/completions", {"model": keyed.served_model_name, "messages": MESSAGES}),
        ("POST", "/v1/load_lora_adapter", {"lora_name": "intruder-v1", "lora_path": adapter_dir}),
        # Left open by vLLM's own --api-key check (it guards /v1, /v2, /inference, /cohere only):
        ("POST", "/invocations", {"model": keyed.served_model_name, "prompt": "def f(", "max_tokens": 2}),
        ("POST", "/adapters", {"name": "intruder-v2", "src": adapter_dir}),
        ("POST", "/tokenize", {"model": keyed.served_model_name, "prompt": "secret"}),
    ]
    with httpx.Client(base_url=keyed.base_url, headers=headers, timeout=60) as http:
        codes = {path: http.request(method, path, json=body).status_code for method, path, body in calls}
        open_probes = {path: http.get(path).status_code for path in ("/health", "/metrics", "/version")}
    assert codes == {path: 401 for _, path, _ in calls}
    assert open_probes == {"/health": 200, "/metrics": 200, "/version": 200}  # read-only, for probes and Prometheus
    assert not {"intruder-v1", "intruder-v2"} & {m.id for m in vllm_client().models()}


def test_strops_calls_to_vllm_carry_the_key(keyed, serve_client, loaded_version):
    version = loaded_version(seed=12)  # load through /v1/load_lora_adapter, confirmed in /v1/models
    client = vllm_client()
    assert version.vllm_name in {m.id for m in client.models()}
    assert client.health() == {keyed.base_url: True}
    completion = serve_client.post(
        "/v1/completions", {"model": "autocomplete", "prompt": "def f(x):\n", "max_tokens": 4}, format="json"
    )
    assert completion.status_code == 200, completion.content
    chat = serve_client.post(
        "/v1/chat/completions",
        {"model": "autocomplete", "messages": MESSAGES, "max_tokens": 4},
        format="json",
    )
    assert chat.status_code == 200, chat.content
    assert Interaction.objects.filter(tenant=serve_client.tenant).count() == 2
    client.unload_adapter(version.vllm_name)
    assert version.vllm_name not in {m.id for m in client.models()}


def test_a_strop_without_the_key_answers_502_naming_the_setting(keyed, serve_client, serving_adapter, settings):
    settings.VLLM_API_KEY = ""
    response = serve_client.post(
        "/v1/completions", {"model": "autocomplete", "prompt": "def f(x):\n", "max_tokens": 4}, format="json"
    )
    assert response.status_code == 502, response.content
    assert response.json()["error"]["code"] == "vllm_error"
    assert "VLLM_API_KEY" in response.json()["error"]["message"]
    assert not Interaction.objects.exists()
