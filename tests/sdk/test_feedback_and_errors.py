"""Feedback sent one by one, and the typed errors every call raises."""

from __future__ import annotations

import uuid

import pytest
from strop import (
    AuthenticationError,
    BadRequestError,
    NotFoundError,
    PayloadTooLargeError,
    PermissionDeniedError,
    Strop,
    StropError,
)

from apps.interactions.models import Feedback

pytestmark = pytest.mark.django_db(transaction=True)


def log(client: Strop, client_id: str) -> str:
    return client.interactions.log(client_id=client_id, prompt="x = ", completion="1").id


def test_send_records_feedback_by_either_id_and_keeps_early_feedback_pending(strop_client, api):
    interaction_id = log(strop_client, "c-1")
    log(strop_client, "c-2")
    by_id = strop_client.feedback.send(interaction_id=interaction_id, outcome="accepted")
    by_client_id = strop_client.feedback.send(
        client_id="c-2", outcome="rejected", occurred_at="2026-11-21T10:00:03Z", metadata={"ms": 800}
    )
    early = strop_client.feedback.send(client_id="c-3", outcome="not_shown")
    assert (by_id.status, by_id.id) == ("recorded", interaction_id)
    assert (by_client_id.status, by_client_id.client_id) == ("recorded", "c-2")
    assert (early.status, early.id) == ("pending", None)
    rows = Feedback.objects.filter(tenant=api.tenant)
    assert sorted(rows.values_list("outcome", flat=True)) == ["accepted", "not_shown", "rejected"]
    assert rows.get(outcome="rejected").metadata == {"ms": 800}


def test_send_batch_gives_a_verdict_per_event(strop_client):
    interaction_id = log(strop_client, "b-1")
    result = strop_client.feedback.send_batch(
        [
            {"interaction_id": interaction_id, "outcome": "accepted"},
            {"client_id": "not-yet", "outcome": "rejected"},
            {"client_id": "b-1", "outcome": "sideways"},
        ]
    )
    assert [r.status for r in result.results] == ["recorded", "pending", "rejected"]
    assert result.counts == {"recorded": 1, "pending": 1, "rejected": 1}
    assert result.rejected[0].error.field == "outcome"


def test_a_bad_outcome_is_a_bad_request_error_naming_the_field(strop_client, api):
    log(strop_client, "c-1")
    with pytest.raises(BadRequestError) as caught:
        strop_client.feedback.send(client_id="c-1", outcome="maybe")
    error = caught.value
    assert (error.status, error.code, error.field) == (400, "invalid", "outcome")
    assert error.message.startswith("outcome:") and error.body["error"]["details"]["field"] == "outcome"
    assert not Feedback.objects.filter(tenant=api.tenant).exists()


def test_a_bad_completion_request_names_the_field_from_the_validation_details(strop_client):
    with pytest.raises(BadRequestError) as caught:
        strop_client.completions.create(prompt="x", prefix="y")
    assert (caught.value.code, caught.value.field) == ("invalid", "prompt")


def test_an_unknown_interaction_id_is_a_not_found_error(strop_client):
    with pytest.raises(NotFoundError) as caught:
        strop_client.feedback.send(interaction_id=str(uuid.uuid4()), outcome="accepted")
    assert caught.value.field == "interaction_id"


def test_a_wrong_key_is_an_authentication_error(api):
    with Strop(base_url=api.url, api_key="strop_nope_nope", max_retries=0) as client:
        with pytest.raises(AuthenticationError) as caught:
            client.interactions.list()
    assert caught.value.status == 401 and caught.value.code == "authentication_failed"


def test_a_key_without_the_scope_is_a_permission_denied_error(make_api):
    api = make_api(scopes=["ingest"])
    with Strop(base_url=api.url, api_key=api.key) as client:
        with pytest.raises(PermissionDeniedError) as caught:
            client.feedback.send(client_id="c-1", outcome="accepted")
    assert caught.value.status == 403


def test_a_batch_over_the_limit_is_a_payload_too_large_error(strop_client, settings):
    settings.STROP_MAX_BATCH_ITEMS = 2
    with pytest.raises(PayloadTooLargeError) as caught:
        strop_client.interactions.log_batch(
            [{"client_id": f"c-{i}", "prompt": "x", "completion": ""} for i in range(3)]
        )
    assert caught.value.status == 413 and isinstance(caught.value, StropError)


def test_values_json_cannot_carry_fail_in_the_caller_before_any_request(strop_client):
    with pytest.raises(ValueError):
        strop_client.interactions.log(client_id="c-1", prompt="x", completion="1", latency_ms=float("nan"))
    with pytest.raises(TypeError):
        strop_client.feedback.enqueue(client_id="c-1", outcome="accepted", metadata={"when": object()})
    assert strop_client.feedback.batcher.stats.enqueued == 0
