"""GET /health/ready proves that the replicas take Strop's vLLM key, not only that they are up:
vLLM's /health needs no key (platform/vllm_plugins/strop_vllm_auth.py, OPEN_PATHS), so a wrong
VLLM_API_KEY passed it while every completion failed. The session's real vLLM runs with the key
middleware (platform/vllm.sh), as a deployment does."""

from __future__ import annotations

import pytest

from apps.serving.readiness import KEY_REFUSED

pytestmark = pytest.mark.django_db


@pytest.mark.vllm
def test_a_replica_that_refuses_strops_key_is_not_ready_and_says_that_is_why(client, served, settings):
    assert served.api_key, "the session's vLLM runs with a key"
    settings.VLLM_API_KEY = "not-" + served.api_key
    response = client.get("/health/ready")
    assert response.status_code == 503, response.content
    body = response.json()
    assert body["failing"] == ["vllm"]
    vllm = body["checks"]["vllm"]
    assert (vllm["replicas_up"], vllm["down"], vllm["error"]) == (0, {"1": KEY_REFUSED}, KEY_REFUSED)
    assert served.api_key not in response.content.decode()

    settings.VLLM_API_KEY = served.api_key  # the right key is checked again, not answered from the cache
    response = client.get("/health/ready")
    assert response.status_code == 200, response.content
    assert response.json()["checks"]["vllm"]["replicas_up"] == 1
