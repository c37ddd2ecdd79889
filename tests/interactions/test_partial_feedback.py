"""A partial accept (``outcome: partial`` with ``accepted_chars``): recorded when it fits the
completion, a 400 naming the field when it does not, never a 500, and nothing stored then."""

from __future__ import annotations

import pytest

from apps.interactions.models import SHOWN_OUTCOMES, Feedback
from apps.interactions.services import feedback_ingest

pytestmark = pytest.mark.django_db

COMPLETION = "return a + b"  # 12 characters: accepted_chars is 1 to 11


def log(client, client_id: str = "c-1", completion: str = COMPLETION) -> str:
    body = {"client_id": client_id, "prefix": "def add(a, b):\n    ", "completion": completion}
    return client.post("/v1/interactions", body, format="json").json()["id"]


def partial(accepted_chars, **target) -> dict:
    return {"outcome": "partial", "accepted_chars": accepted_chars, **target}


@pytest.mark.parametrize("accepted_chars", [1, 8, len(COMPLETION) - 1])
def test_a_partial_accept_within_the_completion_is_recorded_and_read_back(client_a, accepted_chars):
    interaction_id = log(client_a)
    response = client_a.post("/v1/feedback", partial(accepted_chars, interaction_id=interaction_id), format="json")
    assert response.status_code == 200, response.json()
    row = Feedback.objects.get()
    assert (row.outcome, row.accepted_chars) == ("partial", accepted_chars)
    feedback = client_a.get(f"/v1/interactions/{interaction_id}").json()["feedback"]
    assert (feedback["outcome"], feedback["accepted_chars"]) == ("partial", accepted_chars)


@pytest.mark.parametrize(
    ("accepted_chars", "code", "words"),
    [
        (len(COMPLETION), "invalid", "must be from 1 to 11 (the completion has 12 characters"),
        (len(COMPLETION) + 5, "invalid", "must be from 1 to 11"),
        (0, "invalid", "must be from 1 to the completion's length - 1, not 0"),
        (-3, "invalid", "not -3"),
        (2**40, "invalid", "must be from 1"),
        (None, "required", "is required when outcome is 'partial'"),
        ("8", "invalid", "must be a whole number"),
        (8.0, "invalid", "must be a whole number"),
        (True, "invalid", "must be a whole number"),
    ],
)
def test_an_accepted_chars_that_does_not_fit_is_400_naming_the_field_and_stores_nothing(
    client_a, accepted_chars, code, words
):
    interaction_id = log(client_a)
    for target in ({"client_id": "c-1"}, {"interaction_id": interaction_id}):
        response = client_a.post("/v1/feedback", partial(accepted_chars, **target), format="json")
        assert response.status_code == 400, response.json()
        error = response.json()["error"]
        assert (error["code"], error["details"]["field"]) == (code, "accepted_chars")
        assert error["message"].startswith("accepted_chars: ") and words in error["message"], error["message"]
    assert not Feedback.objects.exists()


def test_accepted_chars_goes_with_partial_only(client_a):
    log(client_a)
    response = client_a.post(
        "/v1/feedback", {"client_id": "c-1", "outcome": "accepted", "accepted_chars": 3}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["error"]["details"]["field"] == "accepted_chars"
    assert not Feedback.objects.exists()


@pytest.mark.parametrize("completion", ["", "x"])
def test_a_completion_too_short_to_take_in_part_is_400(client_a, completion):
    log(client_a, completion=completion)
    response = client_a.post("/v1/feedback", partial(1, client_id="c-1"), format="json")
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["details"]["field"] == "accepted_chars" and "send 'accepted' or 'rejected'" in error["message"]
    assert not Feedback.objects.exists()


def test_a_session_outcome_cannot_be_partial(client_a):
    body = {"conversation_id": "s-1", "turn": 0, **partial(3)}
    response = client_a.post("/v1/feedback", body, format="json")
    assert response.status_code == 400
    assert response.json()["error"]["details"]["field"] == "outcome"


def test_a_batch_checks_each_partial_against_its_own_completion(client_a):
    log(client_a, "long")
    log(client_a, "short", completion="x = 1")
    items = [
        partial(7, client_id="long"),
        partial(7, client_id="short"),  # 5 characters: 7 does not fit
        partial(4, client_id="short"),
        partial(50, client_id="not-yet"),  # its completion is unknown: kept pending
        {"client_id": "long", "outcome": "rejected", "occurred_at": "2020-01-01T00:00:00Z"},
    ]
    body = client_a.post("/v1/feedback", {"items": items}, format="json").json()
    assert [r["status"] for r in body["results"]] == ["recorded", "rejected", "recorded", "pending", "recorded"]
    assert body["results"][1]["error"]["field"] == "accepted_chars"
    rows = {row.pending_client_id or row.interaction.client_id: row for row in Feedback.objects.all()}
    assert {name: (row.outcome, row.accepted_chars) for name, row in rows.items()} == {
        "long": ("partial", 7),  # the older rejection does not replace it
        "short": ("partial", 4),
        "not-yet": ("partial", 50),
    }


def test_a_later_full_accept_replaces_a_partial_one_and_clears_its_characters(client_a):
    """Word by word, then the rest: the editor reports each step, the last one wins."""
    log(client_a)
    for accepted_chars, second in ((6, 1), (8, 2)):
        feedback_ingest(
            client_a.tenant,
            items=[partial(accepted_chars, client_id="c-1", occurred_at=f"2026-11-21T10:00:0{second}Z")],
        )
    assert Feedback.objects.get().accepted_chars == 8
    feedback_ingest(
        client_a.tenant, items=[{"client_id": "c-1", "outcome": "accepted", "occurred_at": "2026-11-21T10:00:03Z"}]
    )
    row = Feedback.objects.get()
    assert (row.outcome, row.accepted_chars, row.events_received) == ("accepted", None, 3)


def test_a_pending_partial_accept_is_attached_with_its_characters(client_a):
    response = client_a.post("/v1/feedback", partial(6, client_id="early"), format="json")
    assert response.status_code == 202
    interaction_id = log(client_a, "early")
    row = Feedback.objects.get()
    assert (str(row.interaction_id), row.outcome, row.accepted_chars) == (interaction_id, "partial", 6)


def test_a_partial_accept_counts_as_shown():
    assert Feedback.Outcome.PARTIAL in SHOWN_OUTCOMES


def test_the_openapi_schema_describes_accepted_chars():
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    feedback_in = schema["components"]["schemas"]["FeedbackInSchema"]["properties"]
    assert feedback_in["accepted_chars"]["type"] == "integer" and feedback_in["accepted_chars"]["minimum"] == 1
    assert "partial" in feedback_in["accepted_chars"]["description"]
    outcomes = schema["components"]["schemas"]["OutcomeEnum"]["enum"]
    assert "partial" in outcomes
    feedback_out = schema["components"]["schemas"]["FeedbackOutSchema"]["properties"]
    assert "accepted_chars" in feedback_out
