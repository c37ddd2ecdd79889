"""Chat completions (agents): the official ``openai`` client's ``chat.completions.create`` against
Strop's live server and the real vLLM, plain, streamed and with tools; what is recorded."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from apps.interactions.models import Interaction

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True)]

MESSAGES = [
    {"role": "system", "content": "You write Python."},
    {"role": "user", "content": "A function that adds two numbers."},
]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture
def client(live_server, serve_client, serving_adapter) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=serve_client.raw_key, max_retries=0, timeout=60)


def _templated_ids(interaction: Interaction, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    from transformers import AutoTokenizer

    from learning_shared.chat import chat_prompt_ids

    path = interaction.adapter.base_model.path
    return chat_prompt_ids(AutoTokenizer.from_pretrained(path), path, messages, tools)


def test_a_chat_completion_is_served_and_recorded_with_the_templated_prompt_ids(client):
    completion = client.chat.completions.create(
        model="autocomplete", messages=MESSAGES, max_tokens=8, seed=3, user="dev-1",
        extra_body={"conversation_id": "s-1"},
    )
    choice = completion.choices[0]
    assert completion.object == "chat.completion" and completion.model == "autocomplete"
    assert choice.message.role == "assistant" and choice.finish_reason in ("stop", "length")
    assert choice.logprobs is None  # not asked for
    interaction = Interaction.objects.get(pk=completion.id)
    assert interaction.messages == MESSAGES and interaction.completion == (choice.message.content or "")
    assert interaction.conversation_id == "s-1" and interaction.turn == 0  # no assistant message before it
    assert interaction.end_user_id == "dev-1" and interaction.source == Interaction.Source.SERVED
    # What vLLM built from the template is what the export would build: training sees the same ids.
    assert interaction.prompt_token_ids == _templated_ids(interaction, MESSAGES)
    assert len(interaction.completion_token_ids) == len(interaction.completion_logprobs) >= 1
    assert all(lp <= 0 for lp in interaction.completion_logprobs)
    assert completion.usage.completion_tokens == len(interaction.completion_token_ids)


def test_reading_a_served_chat_completion_back_answers_what_was_written(client, live_server, make_client):
    completion = client.chat.completions.create(
        model="autocomplete", messages=MESSAGES, tools=[WEATHER], max_tokens=4, user="dev-9",
        extra_body={"conversation_id": "s-read", "turn": 3},
    )
    tenant = Interaction.objects.get(pk=completion.id).tenant
    reader = make_client(tenant, scopes=["ingest"])
    read = httpx.get(
        f"{live_server.url}/v1/interactions/{completion.id}",
        headers={"Authorization": f"Bearer {reader.raw_key}"},
        timeout=30,
    ).json()
    assert read["messages"] == MESSAGES and read["tools"] == [WEATHER]
    assert (read["conversation_id"], read["turn"], read["end_user_id"]) == ("s-read", 3, "dev-9")
    assert read["completion"] == (completion.choices[0].message.content or "")


def test_the_turn_defaults_to_the_assistant_messages_before_it(client):
    messages = [*MESSAGES, {"role": "assistant", "content": "def add(a, b): return a + b"},
                {"role": "user", "content": "Now with type hints."}]
    completion = client.chat.completions.create(
        model="autocomplete", messages=messages, max_tokens=4, extra_body={"conversation_id": "s-2"}
    )
    assert Interaction.objects.get(pk=completion.id).turn == 1
    named = client.chat.completions.create(
        model="autocomplete", messages=messages, max_tokens=4, extra_body={"conversation_id": "s-2", "turn": 7}
    )
    assert Interaction.objects.get(pk=named.id).turn == 7


def test_a_streamed_chat_completion_matches_the_whole_one_and_is_recorded(client):
    whole = client.chat.completions.create(model="autocomplete", messages=MESSAGES, max_tokens=8, temperature=0)
    stream = client.chat.completions.create(
        model="autocomplete", messages=MESSAGES, max_tokens=8, temperature=0, stream=True,
        stream_options={"include_usage": True}, logprobs=True,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    interaction = Interaction.objects.get(pk=chunks[0].id)
    assert interaction.completion == text
    assert interaction.completion_token_ids == Interaction.objects.get(pk=whole.id).completion_token_ids
    assert interaction.prompt_token_ids == Interaction.objects.get(pk=whole.id).prompt_token_ids
    streamed_logprobs = [e.logprob for c in chunks if c.choices and c.choices[0].logprobs
                         for e in c.choices[0].logprobs.content]
    assert streamed_logprobs == pytest.approx(interaction.completion_logprobs, abs=1e-4)


def test_a_named_tool_choice_returns_a_tool_call_and_records_it(client):
    # vLLM forces the call's form (<tool_call>{"name": ..., "arguments": ...) and the tool's name; the
    # starter model writes the arguments and sometimes runs out of tokens first: a few seeds get a call.
    for seed in range(1, 13):
        completion = client.chat.completions.create(
            model="autocomplete",
            messages=[{"role": "user", "content": "weather in Paris?"}],
            tools=[WEATHER],
            tool_choice={"type": "function", "function": {"name": "get_weather"}},
            max_tokens=48,
            seed=seed,
        )
        interaction = Interaction.objects.get(pk=completion.id)
        assert interaction.tools == [WEATHER]
        calls = completion.choices[0].message.tool_calls
        if calls:
            break
        assert "tool_calls" not in interaction.metadata
    assert calls, "no seed gave a whole tool call"
    assert calls[0].type == "function" and calls[0].function.name == "get_weather"
    json.loads(calls[0].function.arguments)  # the arguments, as a JSON text
    recorded = interaction.metadata["tool_calls"]
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in recorded] == [
        (c.function.name, c.function.arguments) for c in calls
    ]
    assert interaction.completion_token_ids  # the tokens that wrote the call are what training sees


def test_a_tool_result_in_the_conversation_is_taken(client):
    messages = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call-1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        ]},
        {"role": "tool", "tool_call_id": "call-1", "content": "18 C, sunny"},
    ]
    completion = client.chat.completions.create(model="autocomplete", messages=messages, tools=[WEATHER], max_tokens=6)
    interaction = Interaction.objects.get(pk=completion.id)
    assert interaction.messages == messages
    assert interaction.prompt_token_ids == _templated_ids(interaction, messages, [WEATHER])  # rendered alike


@pytest.mark.parametrize(
    "body, field",
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
        ({"messages": [{"role": "tool", "content": "18 C"}]}, "messages"),
        ({"messages": MESSAGES, "tool_choice": "required"}, "tool_choice"),
        ({"messages": MESSAGES, "tools": []}, "tools"),
        ({"messages": MESSAGES, "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"messages": MESSAGES, "turn": 2}, "turn"),
        ({"messages": MESSAGES, "functions": []}, "functions"),
    ],
)
def test_bad_chat_requests_are_400s_that_name_the_field(live_server, serve_client, serving_adapter, body, field):
    response = httpx.post(
        f"{live_server.url}/v1/chat/completions",
        json={"model": "autocomplete", **body},
        headers={"Authorization": f"Bearer {serve_client.raw_key}"},
        timeout=30,
    )
    assert response.status_code == 400, response.text
    assert field in json.dumps(response.json()["error"])
    assert not Interaction.objects.exists()


def test_continues_chat_request_shape_is_served(live_server, serve_client, serving_adapter):
    """The body Continue's OpenAI provider builds for chat (core/llm/openaiTypeConverters.ts
    toChatBody): empty contents sent as " ", tools with ``strict``, ``prediction`` when it has one."""
    body = {
        "messages": [
            {"role": "system", "content": "You are a coding assistant."},
            {"role": "user", "content": "Rename x to count"},
            {"role": "assistant", "content": " ", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "edit_file", "arguments": "{}"}}]},
            {"role": "tool", "content": "done", "tool_call_id": "c1"},
        ],
        "model": "autocomplete",
        "max_tokens": 8,
        "temperature": 0.5,
        "top_p": 1,
        "frequency_penalty": 0,
        "presence_penalty": 0,
        "stream": True,
        "stop": ["<|im_end|>"],
        "prediction": {"type": "content", "content": "def f(count):"},
        "tools": [{"type": "function", "function": {"name": "edit_file", "description": "Edit a file",
                                                    "parameters": {"type": "object"}, "strict": False}}],
    }
    with httpx.stream(
        "POST", f"{live_server.url}/v1/chat/completions", json=body,
        headers={"Authorization": f"Bearer {serve_client.raw_key}"}, timeout=60,
    ) as response:
        assert response.status_code == 200, response.read()
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and not any('"error"' in e for e in events)
    first = json.loads(events[0][6:])
    assert first["object"] == "chat.completion.chunk" and first["choices"][0]["interaction_id"] == first["id"]
    assert Interaction.objects.get(pk=first["id"]).messages == body["messages"]


def test_a_turn_served_after_its_sessions_outcome_arrived_carries_it(client, live_server, serve_client):
    """An agent's user rated the session before its turn was recorded: the served turn takes the
    outcome as it is stored (apps.interactions.sessions), the request answered as usual."""
    from apps.interactions.models import Feedback

    outcome = {"conversation_id": "s-early", "turn": 0, "outcome": "thumbs_up"}
    sent = httpx.post(
        f"{live_server.url}/v1/feedback",
        json=outcome,
        headers={"Authorization": f"Bearer {serve_client.raw_key}"},
        timeout=60,
    )
    assert sent.status_code < 300, sent.text
    completion = client.chat.completions.create(
        model="autocomplete", messages=MESSAGES, max_tokens=4, extra_body={"conversation_id": "s-early"}
    )
    feedback = Feedback.objects.get(interaction_id=completion.id)
    assert feedback.session_outcome is not None and feedback.outcome == "thumbs_up"
