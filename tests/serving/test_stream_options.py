"""``stream_options`` as OpenAI's client declares it (ChatCompletionStreamOptionsParam): both
completion endpoints take ``include_obfuscation`` and ignore it (Strop's chunks carry no padding);
anything else in it is still a 400 naming the field."""

from __future__ import annotations

import openai
import pytest

from apps.serving.chat_schemas import ChatCompletionIn
from apps.serving.schemas import CompletionIn

OPTIONS = {"include_usage": True, "include_obfuscation": False}
BODIES = {
    "completions": (CompletionIn, {"prompt": "def f(", "stream": True}),
    "chat": (ChatCompletionIn, {"messages": [{"role": "user", "content": "hi"}], "stream": True}),
}


@pytest.mark.parametrize("endpoint", list(BODIES))
def test_include_obfuscation_is_taken_and_ignored(endpoint):
    serializer, body = BODIES[endpoint]
    request = serializer(data={**body, "stream_options": OPTIONS})
    assert request.is_valid(), request.errors
    assert request.validated_data["stream_options"]["include_usage"] is True


@pytest.mark.parametrize("endpoint", list(BODIES))
def test_an_unknown_stream_option_is_still_refused(endpoint):
    serializer, body = BODIES[endpoint]
    request = serializer(data={**body, "stream_options": {"include_padding": True}})
    assert not request.is_valid() and "include_padding" in str(request.errors["stream_options"])


@pytest.mark.vllm
@pytest.mark.django_db(transaction=True)
def test_the_openai_client_streams_chat_with_include_obfuscation(live_server, serve_client, serving_adapter):
    client = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=serve_client.raw_key, max_retries=0, timeout=60)
    stream = client.chat.completions.create(
        model="autocomplete",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=4,
        stream=True,
        stream_options={"include_usage": True, "include_obfuscation": False},
    )
    chunks = list(stream)
    assert chunks and chunks[-1].usage is not None  # include_usage applied
    assert not any("obfuscation" in chunk.to_dict() for chunk in chunks)  # include_obfuscation: nothing to leave out
