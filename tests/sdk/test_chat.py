"""Agents through the SDK: chat completions served by the real vLLM behind the live API, logged
conversations and session outcomes."""

from __future__ import annotations

import asyncio

import pytest
from strop import AsyncStrop, ChatCompletion, Strop

from apps.interactions.models import ConversationOutcome, Feedback, Interaction

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True)]

MESSAGES = [{"role": "user", "content": "A function that adds two numbers."}]


@pytest.fixture
def key(serving_tenant, serving_adapter, make_client) -> str:
    return make_client(serving_tenant, scopes=["serve", "ingest", "feedback"]).raw_key


def test_chat_create_returns_typed_choices_and_a_session_outcome_lands_on_its_turn(live_server, key):
    with Strop(base_url=live_server.url, api_key=key, timeout=120) as sdk:
        chat = sdk.chat.completions.create(messages=MESSAGES, max_tokens=6, conversation_id="s-1", user="dev-1")
        assert isinstance(chat, ChatCompletion) and chat.model == "autocomplete" and chat.object == "chat.completion"
        assert chat.id == chat.choices[0].interaction_id and chat.choices[0].message.role == "assistant"
        assert chat.content == (chat.choices[0].message.content or "")
        result = sdk.feedback.session_outcome(conversation_id="s-1", turn=0, outcome="thumbs_up")
        assert result.status == "recorded"
    feedback = Feedback.objects.get(interaction_id=chat.id)
    assert (feedback.outcome, feedback.reward_weight) == ("thumbs_up", 1.0)
    assert ConversationOutcome.objects.get().conversation_id == "s-1"


def test_logging_an_agent_turn_served_elsewhere(live_server, key):
    with Strop(base_url=live_server.url, api_key=key) as sdk:
        logged = sdk.interactions.log(
            client_id="turn-1", messages=MESSAGES, completion="def add(a, b): ...", conversation_id="s-2", turn=0
        )
        assert logged.created
        sdk.feedback.send(client_id="turn-1", outcome="edit_persisted")
    row = Interaction.objects.get(client_id="turn-1")
    assert (row.messages, row.conversation_id, row.turn) == (MESSAGES, "s-2", 0)
    assert Feedback.objects.get(interaction=row).outcome == "edit_persisted"


def test_the_async_client_has_the_same_chat_calls(live_server, key):
    async def run() -> tuple[ChatCompletion, str]:
        async with AsyncStrop(base_url=live_server.url, api_key=key, timeout=120) as sdk:
            chat = await sdk.chat.completions.create(messages=MESSAGES, max_tokens=4, conversation_id="s-3")
            result = await sdk.feedback.session_outcome(
                conversation_id="s-3", turn=0, outcome="follow_up_dissatisfied", discount=0.5
            )
            return chat, result.status

    chat, status = asyncio.run(run())
    assert status == "recorded"
    assert Feedback.objects.get(interaction_id=chat.id).outcome == "follow_up_dissatisfied"


def test_a_streamed_chat_completion_through_the_sdk_is_recorded_as_served(live_server, key):
    from strop import ChatCompletionChunk, ChatCompletionStream

    with Strop(base_url=live_server.url, api_key=key, timeout=120) as sdk:
        stream = sdk.chat.completions.create(messages=MESSAGES, max_tokens=6, temperature=0, stream=True)
        assert isinstance(stream, ChatCompletionStream)
        with stream:
            chunks = list(stream)
    assert chunks and all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].interaction_id == chunks[0].id
    text = "".join(c.content for c in chunks)
    assert Interaction.objects.get(pk=chunks[0].id).completion == text


def test_the_async_client_streams_chat_too(live_server, key):
    async def run() -> list:
        async with AsyncStrop(base_url=live_server.url, api_key=key, timeout=120) as sdk:
            stream = await sdk.chat.completions.create(messages=MESSAGES, max_tokens=4, stream=True)
            return [chunk async for chunk in stream]

    chunks = asyncio.run(run())
    assert Interaction.objects.get(pk=chunks[0].id).completion == "".join(c.content for c in chunks)
