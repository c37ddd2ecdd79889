"""Completions through the SDK, served by the session's real vLLM server (CPU build) behind the
live API, with the serving fixtures of tests/serving (a tenant and its default adapter)."""

from __future__ import annotations

import asyncio

import pytest
from strop import AsyncStrop, Completion, CompletionChunk, Strop

from apps.interactions.models import Interaction

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True)]

PROMPT = "def parse(line):\n    "


@pytest.fixture
def sdk(live_server, serving_tenant, serving_adapter, make_client):
    key = make_client(serving_tenant, scopes=["serve", "ingest"]).raw_key
    with Strop(base_url=live_server.url, api_key=key, timeout=120) as client:
        yield client


def test_create_returns_typed_choices_recorded_as_interactions(sdk, served):
    completion = sdk.completions.create(prompt=PROMPT, max_tokens=8, seed=7, n=2, user="dev-1", opted_in=True)
    assert isinstance(completion, Completion) and completion.model == "autocomplete"
    assert completion.strop.version == served.served_model_name  # no adapter version yet: the base model
    assert [choice.index for choice in completion.choices] == [0, 1]
    assert completion.id == completion.choices[0].interaction_id
    assert all(choice.finish_reason in {"stop", "length"} for choice in completion.choices)
    assert completion.usage is not None and completion.usage.prompt_tokens > 0
    stored = sdk.interactions.get(completion.id)
    assert (stored.source, stored.completion, stored.end_user_id, stored.opted_in) == (
        "served",
        completion.text,
        "dev-1",
        True,
    )
    assert Interaction.objects.filter(pk__in=[c.interaction_id for c in completion.choices]).count() == 2


def test_stream_yields_chunks_that_add_up_to_the_recorded_completion(sdk):
    with sdk.completions.create(
        prefix="def add(a, b):\n    ", suffix="\n", max_tokens=8, seed=7, stream=True
    ) as stream:
        chunks = list(stream)
    assert chunks and all(isinstance(chunk, CompletionChunk) for chunk in chunks)
    interaction_ids = {chunk.id for chunk in chunks}
    assert len(interaction_ids) == 1
    text = "".join(choice.text for chunk in chunks for choice in chunk.choices)
    (interaction_id,) = interaction_ids
    assert sdk.interactions.get(interaction_id).completion == text


def test_async_create_and_stream_give_the_same_seeded_text(live_server, serving_tenant, serving_adapter, make_client):
    key = make_client(serving_tenant, scopes=["serve"]).raw_key

    async def main() -> tuple:
        async with AsyncStrop(base_url=live_server.url, api_key=key, timeout=120) as client:
            completion = await client.completions.create(prompt=PROMPT, max_tokens=8, seed=11)
            stream = await client.completions.create(prompt=PROMPT, max_tokens=8, seed=11, stream=True)
            async with stream:
                chunks = [chunk async for chunk in stream]
        return completion, chunks

    completion, chunks = asyncio.run(main())
    assert "".join(choice.text for chunk in chunks for choice in chunk.choices) == completion.text
    assert chunks[0].id != completion.id  # two requests, two recorded interactions
    assert Interaction.objects.filter(pk__in=[completion.id, chunks[0].id]).count() == 2
