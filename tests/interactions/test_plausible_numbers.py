"""Numbers no real client sends (a latency of days, a time decades away, a positive log-probability)
are refused with a 400 that names the field and its range, and nothing is stored."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from apps.cohorts.models import EndUser
from apps.interactions.models import ConversationOutcome, Feedback, Interaction

pytestmark = pytest.mark.django_db

ITEM = {"client_id": "c-1", "prompt": "p", "completion": "abc", "completion_token_ids": [1, 2, 3]}
NEXT_WEEK = (datetime.now(UTC) + timedelta(days=7)).isoformat()


def assert_nothing_stored() -> None:
    assert not Interaction.objects.exists()
    assert not Feedback.objects.exists()
    assert not ConversationOutcome.objects.exists()
    assert not EndUser.objects.exists()


@pytest.mark.parametrize(
    ("patch", "field", "words"),
    [
        ({"latency_ms": 3_600_001}, "latency_ms", "from 0 to 3600000 milliseconds, not "),
        ({"latency_ms": -1}, "latency_ms", "from 0 to 3600000 milliseconds, not "),
        ({"served_at": "1970-01-01T00:00:00Z"}, "served_at", "from 2000-01-01T00:00:00Z to a day from now"),
        ({"served_at": NEXT_WEEK}, "served_at", "from 2000-01-01T00:00:00Z to a day from now"),
        ({"completion_logprobs": [-0.5, 0.7, -0.1]}, "completion_logprobs", "item 1 is 0.7"),
        ({"completion_logprobs": [-0.5, -1e6, -0.1]}, "completion_logprobs", "from -10000 to 0"),
        ({"conversation_id": "s-1", "turn": 100_001, "messages": [{"role": "user", "content": "x"}], "prompt": None},
         "turn", "to 100000"),
    ],
)
def test_an_implausible_number_in_an_interaction_is_a_400_naming_field_and_range(client_a, patch, field, words):
    item = {key: value for key, value in {**ITEM, "end_user_id": "dev-1", **patch}.items() if value is not None}
    response = client_a.post("/v1/interactions", item, format="json")
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert message.startswith(f"{field}:") and words in message
    batch = client_a.post("/v1/interactions", {"items": [item]}, format="json").json()
    assert batch["rejected"] == 1 and batch["results"][0]["error"]["field"] == field
    assert_nothing_stored()


def test_numbers_at_the_edges_of_their_ranges_are_stored(client_a):
    item = {
        **ITEM,
        "latency_ms": 3_600_000,
        "served_at": "2000-01-01T00:00:00Z",
        "completion_logprobs": [0.0, -10_000.0, -3.5],
    }
    assert client_a.post("/v1/interactions", item, format="json").status_code == 201
    assert Interaction.objects.get().latency_ms == 3_600_000


@pytest.mark.parametrize(
    ("patch", "field", "words"),
    [
        ({"occurred_at": "1999-12-31T23:59:59Z"}, "occurred_at", "from 2000-01-01T00:00:00Z"),
        ({"occurred_at": NEXT_WEEK}, "occurred_at", "a day from now"),
    ],
)
def test_an_implausible_time_in_feedback_is_a_400(client_a, patch, field, words):
    response = client_a.post("/v1/feedback", {"client_id": "c-9", "outcome": "accepted", **patch}, format="json")
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert message.startswith(f"{field}:") and words in message
    assert_nothing_stored()


@pytest.mark.parametrize(
    ("patch", "field", "words"),
    [
        ({"turn": 100_001}, "turn", "to 100000"),
        ({"turn": 2, "discount": 1.5}, "discount", "from 0 to 1"),
        ({"turn": 2, "discount": -0.1}, "discount", "from 0 to 1"),
    ],
)
def test_an_implausible_number_in_a_session_outcome_is_a_400(client_a, patch, field, words):
    body = {"conversation_id": "s-1", "outcome": "accepted", **patch}
    response = client_a.post("/v1/feedback", body, format="json")
    assert response.status_code == 400
    message = response.json()["error"]["message"]
    assert message.startswith(f"{field}:") and words in message
    assert_nothing_stored()


@pytest.mark.parametrize(
    ("patch", "field"),
    [({"time": 10**9}, "time"), ({"timestamp": 32_503_680_000_000}, "timestamp"), ({"time": -5}, "time")],
)
def test_an_implausible_number_in_an_editor_outcome_is_a_400_naming_the_outcomes_field(client_a, patch, field):
    body = {"completionId": "e-1", "prompt": "p", "completion": "c", "accepted": True, "uniqueId": "dev-1", **patch}
    response = client_a.post("/v1/editor/autocomplete", body, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith(f"{field}:")
    assert_nothing_stored()
