"""The official ``openai`` client against Strop's live server and the real vLLM (CPU build)."""

from __future__ import annotations

import openai
import pytest

from apps.interactions.models import Interaction

pytestmark = [pytest.mark.vllm, pytest.mark.django_db(transaction=True)]

PROMPT = "def parse(line):\n    "


@pytest.fixture
def client(live_server, serve_client, serving_adapter) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=serve_client.raw_key, max_retries=0, timeout=60)


def test_completion(client):
    completion = client.completions.create(model="autocomplete", prompt=PROMPT, max_tokens=8, seed=3)
    choice = completion.choices[0]
    assert completion.object == "text_completion" and completion.model == "autocomplete"
    assert choice.finish_reason in ("stop", "length") and completion.usage.completion_tokens >= 1
    assert Interaction.objects.get(pk=completion.id).completion == choice.text


def test_openais_insert_form_prompt_and_suffix_is_served_as_fim(client, served):
    from transformers import AutoTokenizer

    completion = client.completions.create(
        model="autocomplete", prompt="def add(a, b):\n    ", suffix="\n\nprint(add(1, 2))\n", max_tokens=8, seed=3
    )
    interaction = Interaction.objects.get(pk=completion.id)
    assert (interaction.prefix, interaction.suffix) == ("def add(a, b):\n    ", "\n\nprint(add(1, 2))\n")
    tokenizer = AutoTokenizer.from_pretrained(served.model_dir)
    assert interaction.prompt_token_ids[0] == tokenizer.convert_tokens_to_ids("<|fim_prefix|>")
    assert completion.model_extra["strop"]["fim"]["convention"] == "prompt/suffix"


def test_a_stream_read_the_usual_way_never_meets_an_empty_choices_chunk(client):
    whole = client.completions.create(model="autocomplete", prompt=PROMPT, max_tokens=8, temperature=0)
    stream = client.completions.create(model="autocomplete", prompt=PROMPT, max_tokens=8, temperature=0, stream=True)
    text = "".join(chunk.choices[0].text for chunk in stream)  # IndexError if a chunk had no choices
    assert text == whole.choices[0].text


def test_the_usage_chunk_comes_only_when_asked_for(client):
    chunks = list(
        client.completions.create(
            model="autocomplete", prompt=PROMPT, max_tokens=6, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    assert all(chunk.choices for chunk in chunks[:-1])


def test_logprobs_come_back_with_their_alternatives(client):
    completion = client.completions.create(model="autocomplete", prompt=PROMPT, max_tokens=4, logprobs=3, seed=1)
    logprobs = completion.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs) >= 1
    assert all(len(top) >= 3 for top in logprobs.top_logprobs)
    assert all(lp <= 0 for lp in logprobs.token_logprobs)


def test_sampling_options_vllm_supports_are_passed_through(client):
    greedy = client.completions.create(model="autocomplete", prompt=PROMPT, max_tokens=1, temperature=0, logprobs=1)
    first = greedy.choices[0]
    token_id = Interaction.objects.get(pk=greedy.id).completion_token_ids[0]
    banned = client.completions.create(
        model="autocomplete",
        prompt=PROMPT,
        max_tokens=1,
        temperature=0,
        logit_bias={str(token_id): -100},
        frequency_penalty=0.5,
        presence_penalty=0.5,
    )
    assert Interaction.objects.get(pk=banned.id).completion_token_ids[0] != token_id
    assert first.finish_reason in ("stop", "length")


def test_echo_returns_the_prompt_before_the_completion(client):
    completion = client.completions.create(model="autocomplete", prompt=PROMPT, max_tokens=4, echo=True, seed=2)
    assert completion.choices[0].text.startswith(PROMPT)
    assert Interaction.objects.get(pk=completion.id).completion == completion.choices[0].text[len(PROMPT) :]


def test_models_lists_the_tenants_adapters(client):
    assert [model.id for model in client.models.list()] == ["autocomplete"]


def test_errors_are_the_clients_typed_exceptions(client):
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="no-such-adapter", prompt=PROMPT, max_tokens=2)
    assert missing.value.body["code"] == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        client.completions.create(model="autocomplete", prompt=PROMPT, n=100)
    assert (bad.value.type, bad.value.param, bad.value.code) == ("invalid_request_error", "n", "invalid")
    assert bad.value.body["message"] == "n: must be at most 8 (got 100)"
    with pytest.raises(openai.NotFoundError) as no_route:
        client.embeddings.create(model="autocomplete", input="x")  # Strop serves no embeddings
    assert no_route.value.body["code"] == "not_found"


def test_many_stop_strings_all_apply_and_max_tokens_is_capped(client, serving_adapter):
    serving_adapter.max_completion_tokens = 12
    serving_adapter.save(update_fields=["max_completion_tokens"])
    free = client.completions.create(model="autocomplete", prompt=PROMPT, max_tokens=4096, temperature=0)
    text = free.choices[0].text
    assert Interaction.objects.get(pk=free.id).metadata["max_tokens_requested"] == 4096
    assert len(Interaction.objects.get(pk=free.id).completion_token_ids) <= 12
    assert len(text) >= 3, text
    # Ten stop strings that never occur, then one that cuts the text after its first two characters.
    stops = [f"<never-{i}>" for i in range(10)] + [text[2:4]]
    for stream in (False, True):
        answer = client.completions.create(
            model="autocomplete", prompt=PROMPT, max_tokens=4096, temperature=0, stop=stops, stream=stream
        )
        chunks = list(answer) if stream else [answer]
        cut = "".join(chunk.choices[0].text for chunk in chunks if chunk.choices)
        assert cut == text[: text.index(text[2:4])], (stream, cut, text)
        assert chunks[-1].choices[0].finish_reason == "stop"
        recorded = Interaction.objects.get(pk=chunks[0].id)
        assert recorded.completion == cut
        assert 1 <= len(recorded.completion_token_ids) <= len(Interaction.objects.get(pk=free.id).completion_token_ids)


def test_a_tool_list_past_its_bounds_is_the_clients_bad_request_naming_the_limit(client):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(
            model="autocomplete", messages=[{"role": "user", "content": "hi"}], tools=[tool] * 129, max_tokens=2
        )
    assert bad.value.body["message"].startswith("tools:") and "at most 128 tools" in bad.value.body["message"]
    assert not Interaction.objects.exists()
