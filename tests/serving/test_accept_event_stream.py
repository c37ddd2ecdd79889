"""The completion endpoints take ``Accept: text/event-stream`` as well as JSON. openai-python sends
``Accept: application/json`` on every request, streams included (``default_headers`` in
openai/_base_client.py), so it never meets this; SSE client libraries send ``text/event-stream``
alone when they ask for a stream (httpx-sse's ``connect_sse``). As OpenAI's API, Strop then answers
the stream as events, and a whole completion and every error as JSON in OpenAI's error object; an
``Accept`` that takes neither is still a 406, as on every endpoint. Upstream is the mock vLLM."""

from __future__ import annotations

import json

import pytest

from apps.adapters.models import Adapter, BaseModel
from apps.interactions.models import Interaction

pytestmark = pytest.mark.django_db

SSE = "text/event-stream"


@pytest.fixture
def client(settings, make_tenant, make_client, mock_upstream):
    settings.VLLM_BASE_URLS = [mock_upstream.base_url]
    tenant = make_tenant("sse")
    base = BaseModel.objects.create(name=mock_upstream.model, path="/nonexistent", family="qwen")
    Adapter.objects.create(tenant=tenant, name="tab", base_model=base, is_default=True)
    return make_client(tenant, scopes=["serve"])


def _post(client, path: str, accept: str, **body):
    return client.post(path, body, format="json", HTTP_ACCEPT=accept)


def test_a_stream_asked_for_with_accept_event_stream_alone_is_served_as_events(client):
    response = _post(client, "/v1/completions", SSE, prompt="def f(", max_tokens=3, stream=True)
    assert response.status_code == 200 and response["Content-Type"] == SSE, response.content
    events = [e.removeprefix("data: ") for e in b"".join(response.streaming_content).decode().split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == " t0 t1 t2"
    assert Interaction.objects.get(pk=chunks[0]["id"]).completion == " t0 t1 t2"


def test_a_whole_completion_asked_for_with_accept_event_stream_is_answered_in_json(client):
    response = _post(client, "/v1/completions", SSE, prompt="def f(", max_tokens=2)
    assert response.status_code == 200 and response["Content-Type"] == "application/json", response.content
    assert response.json()["choices"][0]["text"] == " t0 t1"


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/completions", {"prompt": "def f(", "max_tokens": 0, "stream": True}),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0, "stream": True}),
    ],
)
def test_an_error_for_a_client_that_accepts_only_events_is_openais_json_error(client, path, body):
    response = _post(client, path, SSE, **body)
    assert response.status_code == 400 and response["Content-Type"] == "application/json", response.content
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", "max_tokens", "invalid")


def test_an_accept_that_takes_neither_json_nor_events_is_still_406(client):
    response = _post(client, "/v1/completions", "text/html", prompt="def f(", max_tokens=2, stream=True)
    assert response.status_code == 406 and response.json()["error"]["code"] == "not_acceptable"
