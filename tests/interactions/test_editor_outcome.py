from __future__ import annotations

import pytest

from apps.interactions.models import Feedback, Interaction

pytestmark = pytest.mark.django_db

OUTCOME = {
    "accepted": True,
    "time": 182,
    "prefix": "def greet(name):\n    ",
    "suffix": "\n",
    "prompt": "<|fim_prefix|>def greet(name):\n    <|fim_suffix|>\n<|fim_middle|>",
    "completion": "return f'hello {name}'",
    "modelProvider": "openai",
    "modelName": "strop/acme",
    "completionOptions": {"temperature": 0.2},
    "cacheHit": False,
    "numLines": 1,
    "filepath": "file:///src/app.py",
    "gitRepo": "git@example.com:acme/app.git",
    "completionId": "0b6f3a2e-1111-4f00-9a53-2a9f7f3c0c11",
    "uniqueId": "machine-42",
    "timestamp": "2026-11-21T10:00:00.000Z",
    "debounceDelay": 350,
}


def test_continue_outcome_becomes_an_interaction_and_its_feedback(client_a):
    response = client_a.post("/v1/editor/autocomplete", OUTCOME, format="json")
    assert response.status_code == 201
    interaction = Interaction.objects.get()
    assert interaction.source == "editor"
    assert interaction.client_id == OUTCOME["completionId"]
    assert (interaction.prefix, interaction.suffix) == (OUTCOME["prefix"], OUTCOME["suffix"])
    assert (interaction.model_name, interaction.end_user_id, interaction.latency_ms) == (
        "strop/acme",
        "machine-42",
        182,
    )
    assert interaction.metadata["filepath"] == "file:///src/app.py" and interaction.metadata["numLines"] == 1
    assert Feedback.objects.get().outcome == "accepted"


def test_outcome_without_accepted_logs_only_the_interaction(client_a):
    body = {key: value for key, value in OUTCOME.items() if key != "accepted"}
    assert client_a.post("/v1/editor/autocomplete", body, format="json").status_code == 201
    assert Interaction.objects.count() == 1 and Feedback.objects.count() == 0


def test_repeated_outcome_is_idempotent_and_the_later_verdict_counts(client_a):
    client_a.post("/v1/editor/autocomplete", {**OUTCOME, "accepted": True}, format="json")
    again = client_a.post("/v1/editor/autocomplete", {**OUTCOME, "accepted": False}, format="json")
    assert again.status_code == 200
    assert Interaction.objects.count() == 1
    row = Feedback.objects.get()
    assert (row.outcome, row.events_received) == ("rejected", 2)


def test_numeric_epoch_timestamp_is_accepted(client_a):
    body = {**OUTCOME, "timestamp": 1_763_719_200_000}
    assert client_a.post("/v1/editor/autocomplete", body, format="json").status_code == 201


@pytest.mark.parametrize(
    ("patch", "field"),
    [({"completionId": None}, "completionId"), ({"accepted": "yes"}, "accepted"), ({"time": -1}, "time")],
)
def test_bad_outcome_names_the_plugin_field(client_a, patch, field):
    body = {**OUTCOME, **patch}
    body = {key: value for key, value in body.items() if value is not None}
    response = client_a.post("/v1/editor/autocomplete", body, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith(field)
    assert Interaction.objects.count() == 0
