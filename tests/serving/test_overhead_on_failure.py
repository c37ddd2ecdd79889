"""``X-Strop-Overhead-Ms`` leaves out the wait on vLLM on every answer, errors included: a request vLLM
kept waiting and then failed (an error after a while, or no answer within ``VLLM_TIMEOUT_S``) says
how long Strop spent on it, not how long vLLM took to fail. The upstream is a stand-in that waits."""

from __future__ import annotations

import time

import pytest

from apps.adapters.models import Adapter, BaseModel
from apps.interactions.models import Interaction, ServingFailure
from tests.serving.scripted_vllm import vllm_error

pytestmark = pytest.mark.django_db

WAIT_S = 1.0  # how long vLLM keeps each request waiting before it fails

BODIES = {
    "/v1/completions": {"prompt": "def f(", "max_tokens": 4},
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize(
    ("failure", "status", "code"), [("fails", 502, "vllm_error"), ("stalls", 503, "vllm_unavailable")]
)
def test_the_overhead_header_leaves_out_the_wait_on_a_vllm_that_failed(
    settings, make_tenant, make_client, scripted_vllm, failure, status, code, path, stream
):
    tenant = make_tenant("waits")
    base = BaseModel.objects.create(name="m", path="/nonexistent", family="qwen")
    Adapter.objects.create(tenant=tenant, name="tab", base_model=base, is_default=True)
    client = make_client(tenant, scopes=["serve"])
    if failure == "fails":  # an error after WAIT_S
        scripted_vllm.delay_s = WAIT_S
        scripted_vllm.script = lambda path, body: vllm_error(500, "EngineCore died", "InternalServerError")
    else:  # no answer within the timeout, WAIT_S
        settings.VLLM_TIMEOUT_S = WAIT_S
        scripted_vllm.delay_s = WAIT_S + 0.5

    started = time.perf_counter()
    response = client.post(path, {**BODIES[path], "stream": stream}, format="json")
    elapsed_ms = (time.perf_counter() - started) * 1000

    assert response.status_code == status and response.json()["error"]["code"] == code, response.content
    overhead_ms = float(response["X-Strop-Overhead-Ms"])
    # At least WAIT_S of the request was spent waiting on vLLM: Strop's own time is the rest at most.
    assert 0 <= overhead_ms <= elapsed_ms - WAIT_S * 1000 + 0.01, (overhead_ms, elapsed_ms)
    assert ServingFailure.objects.get().kind == code  # counted in the error rate, as before
    assert not Interaction.objects.exists()
