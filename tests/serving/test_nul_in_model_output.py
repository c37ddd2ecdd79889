"""A byte-level model can sample the byte 0x00. Postgres takes it in neither text nor jsonb, so
wherever model output is kept (the completion, what a show gate withheld, a tool call's name and
arguments) U+FFFD stands in (``apps.interactions.served.model_text_storable``): the interaction is
recorded, not lost after vLLM generated it. The client gets what vLLM wrote."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from apps.adapters.models import Adapter, AdapterVersion, BaseModel
from apps.interactions.models import Interaction
from tests.serving.scripted_vllm import completion_answer

pytestmark = pytest.mark.django_db

NAME, ARGUMENTS = "lookup\x00", '{"q": "\x00"}'


@pytest.fixture
def client(make_tenant, make_client):
    tenant = make_tenant("nul")
    base = BaseModel.objects.create(name="m", path="/nonexistent", family="qwen")
    Adapter.objects.create(tenant=tenant, name="tab", base_model=base, is_default=True)
    return make_client(tenant, scopes=["serve"])


def test_a_suggestion_with_a_nul_the_show_gate_withheld_is_recorded(client, scripted_vllm):
    adapter = Adapter.objects.get(tenant=client.tenant)
    version = AdapterVersion.objects.create(
        tenant=client.tenant, adapter=adapter, number=1, artifact_path="/x/v1", vllm_name="t--tab--v1",
        status="production", loaded_at=timezone.now(), show_gate={"threshold": -0.1},
    )  # fmt: skip
    Adapter.objects.filter(pk=adapter.pk).update(production_version=version)
    scripted_vllm.script = lambda path, body: (200, completion_answer(body["model"], "a\x00b", logprob=-1.0))

    response = client.post("/v1/completions", {"prompt": "def f(", "max_tokens": 3}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["choices"][0]["text"] == ""  # withheld: the client gets nothing
    gate = Interaction.objects.get(pk=response.json()["id"]).metadata["show_gate"]
    assert gate["withheld"] is True and gate["text"] == "a\ufffdb"


def _tool_call_chunks(model: str) -> list[dict]:
    """A tool call as vLLM streams it: its id and name first, then the arguments."""
    first = {"role": "assistant", "tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                                  "function": {"name": NAME, "arguments": ""}}]}  # fmt: skip
    rest = {"tool_calls": [{"index": 0, "function": {"arguments": ARGUMENTS}}]}
    return [
        {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": model,
         "prompt_token_ids": [1, 2] if i == 0 else None,
         "choices": [{"index": 0, "delta": delta, "token_ids": [5 + i], "logprobs": {"content": [{"logprob": -0.5}]},
                      "finish_reason": "tool_calls" if i == 1 else None}]}
        for i, delta in enumerate((first, rest))
    ]  # fmt: skip


def _tool_call_answer(model: str) -> dict:
    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": NAME, "arguments": ARGUMENTS}}]}  # fmt: skip
    choice = {"index": 0, "message": message, "token_ids": [5, 6], "finish_reason": "tool_calls",
              "logprobs": {"content": [{"logprob": -0.5}, {"logprob": -0.5}]}}  # fmt: skip
    return {"id": "chatcmpl-1", "object": "chat.completion", "model": model, "choices": [choice],
            "prompt_token_ids": [1, 2]}  # fmt: skip


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_call_with_a_nul_in_its_name_and_arguments_is_recorded(client, scripted_vllm, stream):
    scripted_vllm.script = lambda path, body: (
        200, _tool_call_chunks(body["model"]) if body.get("stream") else _tool_call_answer(body["model"])
    )  # fmt: skip
    body = {"messages": [{"role": "user", "content": "find it"}], "max_tokens": 8, "stream": stream}
    response = client.post("/v1/chat/completions", body, format="json")
    assert response.status_code == 200, response.content
    if stream:
        raw = b"".join(response.streaming_content).decode()
        events = [e.removeprefix("data: ") for e in raw.split("\n\n") if e]
        assert events[-1] == "[DONE]" and not any("error" in json.loads(e) for e in events[:-1]), events
        interaction_id = json.loads(events[0])["id"]
    else:
        interaction_id = response.json()["id"]
        assert response.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == NAME
    (call,) = Interaction.objects.get(pk=interaction_id).metadata["tool_calls"]
    assert call["function"] == {"name": "lookup\ufffd", "arguments": '{"q": "\ufffd"}'}
