"""A version's show gate at serving time, against the real vLLM server (CPU build): a suggestion
below the threshold reaches the client as nothing, and is recorded as withheld, never trained on."""

from __future__ import annotations

import json

import pytest

from apps.adapters.services import adapter_version_promote
from apps.cohorts.services import end_user_consent_set
from apps.engines.vllm import vllm_client
from apps.interactions.models import Interaction
from apps.training.selectors import training_events_eligible

pytestmark = [pytest.mark.vllm, pytest.mark.django_db]

PROMPT = "def parse(line):\n    "


@pytest.fixture
def gated(serving_tenant, serving_adapter, loaded_version):
    """``gate(threshold, explore)``: production is a loaded version with that show gate."""

    def make(threshold: float, explore: float = 0.0):
        end_user_consent_set(serving_tenant, external_id="dev-1", opted_in=True, source="api", actor="test")
        version = loaded_version(seed=21)
        version.show_gate = {"threshold": threshold, "explore": explore}
        version.save(update_fields=["show_gate"])
        adapter_version_promote(serving_tenant, version=version, actor="test")
        return version

    return make


def complete(client, **body):
    return client.post(
        "/v1/completions", {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "user": "dev-1", **body}, format="json"
    )


def test_a_suggestion_below_the_threshold_is_withheld_recorded_and_never_trained_on(
    serve_client, serving_adapter, gated
):
    version = gated(threshold=1.0)  # every log-probability is below 1: everything is withheld
    direct = vllm_client().complete(model=version.vllm_name, prompt=PROMPT, max_tokens=8, temperature=0)
    assert direct.choice.text.strip()
    body = complete(serve_client).json()
    choice = body["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == ("", "stop")
    interaction = Interaction.objects.get(pk=body["id"])
    assert interaction.completion == ""
    gate = interaction.metadata["show_gate"]
    assert gate["withheld"] is True and gate["text"] == direct.choice.text and gate["threshold"] == 1.0
    assert gate["score"] == pytest.approx(sum(direct.choice.logprobs), abs=1e-3)
    assert interaction.completion_token_ids == direct.choice.token_ids  # what the model wrote, for the record

    # The editor saw nothing and says so; that says nothing of the withheld suggestion: not a training event.
    # The same feedback on a suggestion the gate let through is one.
    version.show_gate = {"threshold": -1e6, "explore": 0.0}
    version.save(update_fields=["show_gate"])
    shown = complete(serve_client).json()
    assert shown["choices"][0]["text"] == direct.choice.text
    for interaction_id in (body["id"], shown["id"]):
        assert (
            serve_client.post(
                "/v1/feedback", {"interaction_id": interaction_id, "outcome": "not_shown"}, format="json"
            ).status_code
            == 200
        )
    eligible = training_events_eligible(serving_adapter, parent=None)
    assert [str(i) for i in eligible.values_list("interaction_id", flat=True)] == [shown["id"]]


def test_a_suggestion_above_the_threshold_is_shown_with_its_score_recorded(serve_client, gated):
    version = gated(threshold=-1e6)
    direct = vllm_client().complete(model=version.vllm_name, prompt=PROMPT, max_tokens=8, temperature=0)
    body = complete(serve_client).json()
    assert body["choices"][0]["text"] == direct.choice.text
    gate = Interaction.objects.get(pk=body["id"]).metadata["show_gate"]
    assert gate["withheld"] is False and "explored" not in gate
    assert gate["score"] == pytest.approx(sum(direct.choice.logprobs), abs=1e-3)


def test_exploration_shows_a_withheld_suggestion_and_weighs_it_for_the_next_fit(serve_client, serving_adapter, gated):
    gated(threshold=1.0, explore=1.0)
    body = complete(serve_client).json()
    assert body["choices"][0]["text"].strip()
    gate = Interaction.objects.get(pk=body["id"]).metadata["show_gate"]
    assert gate == {**gate, "withheld": False, "explored": True, "weight": 1.0}
    serve_client.post("/v1/feedback", {"interaction_id": body["id"], "outcome": "accepted"}, format="json")
    assert training_events_eligible(serving_adapter, parent=None).filter(interaction_id=body["id"]).exists()


def test_a_stream_through_a_gated_version_arrives_whole_and_is_recorded_alike(serve_client, gated):
    gated(threshold=1.0)
    response = complete(serve_client, stream=True, stream_options={"include_usage": True}, n=2, temperature=1.0, seed=3)
    assert response.status_code == 200, response.json()
    assert response["Content-Type"] == "text/event-stream"
    raw = b"".join(response.streaming_content).decode()
    events = [line[len("data: ") :] for line in raw.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [c["choices"][0]["text"] for c in chunks if c["choices"]]
    assert texts == ["", ""] and chunks[-1]["usage"]["completion_tokens"] > 0
    ids = [c["choices"][0]["interaction_id"] for c in chunks if c["choices"]]
    recorded = Interaction.objects.filter(pk__in=ids)
    assert len(recorded) == 2 and all(i.metadata["show_gate"]["withheld"] for i in recorded)


@pytest.mark.django_db(transaction=True)
def test_the_openai_client_reads_a_gated_version_whole_and_streamed(live_server, serve_client, gated):
    import openai

    gated(threshold=1.0)
    client = openai.OpenAI(base_url=f"{live_server.url}/v1", api_key=serve_client.raw_key, max_retries=0, timeout=60)
    whole = client.completions.create(model="autocomplete", prompt=PROMPT, max_tokens=8, temperature=0, user="dev-1")
    assert (whole.choices[0].text, whole.choices[0].finish_reason) == ("", "stop")
    chunks = list(
        client.completions.create(
            model="autocomplete", prompt=PROMPT, max_tokens=8, temperature=0, user="dev-1", stream=True
        )
    )
    assert [(c.choices[0].text, c.choices[0].finish_reason) for c in chunks] == [("", "stop")]
    assert Interaction.objects.get(pk=chunks[0].id).metadata["show_gate"]["withheld"] is True
