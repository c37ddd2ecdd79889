"""Bad input is a 4xx whose message names the field, and stores nothing."""

from __future__ import annotations

import pytest
from django.test import override_settings

from apps.interactions.models import Feedback, Interaction

pytestmark = pytest.mark.django_db


def raw_post(client, path: str, body: bytes):
    return client.generic("POST", path, body, content_type="application/json")


def error_of(response) -> dict:
    return response.json()["error"]


def test_malformed_json_is_400(client_a):
    response = raw_post(client_a, "/v1/interactions", b'{"client_id": "a", ')
    assert response.status_code == 400
    assert error_of(response)["code"] == "malformed_json"


def test_invalid_utf8_is_400(client_a):
    response = raw_post(client_a, "/v1/interactions", b'{"client_id": "a", "prompt": "\xff\xfe", "completion": ""}')
    assert response.status_code == 400
    assert error_of(response)["code"] == "invalid_utf8"


@pytest.mark.parametrize("number", [b"NaN", b"Infinity", b"-Infinity", b"1e400"])
def test_nan_and_infinite_numbers_are_400(client_a, number):
    body = b'{"client_id": "a", "prompt": "p", "completion": "c", "latency_ms": ' + number + b"}"
    response = raw_post(client_a, "/v1/interactions", body)
    assert response.status_code == 400
    assert error_of(response)["code"] == "non_finite_number"


@pytest.mark.parametrize(
    ("patch", "field", "words"),
    [
        ({"completion": 5}, "completion", "must be a string"),
        ({"client_id": ""}, "client_id", "must not be blank"),
        ({"client_id": None}, "client_id", "is required"),
        ({"completion_token_ids": [1, -2]}, "completion_token_ids", "item 1"),
        ({"completion_token_ids": [1, 2.5]}, "completion_token_ids", "item 1"),
        ({"completion_token_ids": [1, 2], "completion_logprobs": [-1.0]}, "completion_logprobs", "has 1 values"),
        ({"completion_logprobs": [-1.0]}, "completion_logprobs", "needs completion_token_ids"),
        ({"completion_token_ids": [1], "completion_logprobs": [0.5]}, "completion_logprobs", "at most 0"),
        ({"served_at": "yesterday"}, "served_at", "ISO 8601"),
        ({"served_at": "2026-11-21T10:00:00"}, "served_at", "timezone"),
        ({"opted_in": "yes"}, "opted_in", "true or false"),
        ({"metadata": [1]}, "metadata", "JSON object"),
        ({"prompt": "a\u0000b"}, "prompt", "NUL"),
        ({"completoin": "typo"}, "completoin", "not a known field"),
    ],
)
def test_wrong_field_is_400_naming_it(client_a, patch, field, words):
    body = {"client_id": "x", "prompt": "p", "completion": "c", **patch}
    body = {key: value for key, value in body.items() if value is not None}
    response = client_a.post("/v1/interactions", body, format="json")
    assert response.status_code == 400, response.json()
    message = error_of(response)["message"]
    assert message.startswith(field) and words in message
    assert Interaction.objects.count() == 0


def test_missing_prompt_and_prefix_is_400(client_a):
    response = client_a.post("/v1/interactions", {"client_id": "x", "completion": "c"}, format="json")
    assert response.status_code == 400
    assert "prefix" in error_of(response)["message"]


def test_batch_that_is_not_a_list_is_400(client_a):
    response = client_a.post("/v1/interactions", {"items": {"a": 1}}, format="json")
    assert response.status_code == 400
    assert error_of(response)["message"] == "items: must be a list"


@override_settings(STROP_MAX_BATCH_ITEMS=10)
def test_oversize_batch_is_413_and_stores_nothing(client_a):
    items = [{"client_id": f"c{n}", "prompt": "p", "completion": "c"} for n in range(11)]
    response = client_a.post("/v1/interactions", {"items": items}, format="json")
    assert response.status_code == 413
    assert "at most 10 items" in error_of(response)["message"]
    assert Interaction.objects.count() == 0


@override_settings(STROP_MAX_BODY_BYTES=1000)
def test_oversize_body_is_413(client_a):
    response = client_a.post(
        "/v1/interactions", {"client_id": "c", "prompt": "p" * 2000, "completion": ""}, format="json"
    )
    assert response.status_code == 413
    assert error_of(response)["code"] == "payload_too_large"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"outcome": "accepted"}, "interaction_id"),
        ({"client_id": "a", "interaction_id": "b", "outcome": "accepted"}, "interaction_id"),
        ({"interaction_id": "not-a-uuid", "outcome": "accepted"}, "interaction_id"),
        ({"client_id": "a", "outcome": "maybe"}, "outcome"),
        ({"client_id": "a", "outcome": "edited"}, "kept_text"),
        ({"client_id": "a", "outcome": "accepted", "occurred_at": 5}, "occurred_at"),
    ],
)
def test_bad_feedback_is_400_naming_the_field(client_a, body, field):
    response = client_a.post("/v1/feedback", body, format="json")
    assert response.status_code == 400
    assert error_of(response)["message"].startswith(field)
    assert Feedback.objects.count() == 0


def test_non_object_item_is_rejected_in_a_batch(client_a):
    body = client_a.post("/v1/interactions", {"items": [1, "x", None]}, format="json").json()
    assert body["rejected"] == 3
    assert body["results"][0]["error"]["message"] == "item: must be a JSON object"
