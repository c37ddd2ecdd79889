from __future__ import annotations

import pytest

from apps.interactions.models import Feedback, Interaction
from apps.interactions.services import feedback_attach_pending, feedback_ingest
from workers.ingest import feedback_attach_pending_all as sweeper_task

pytestmark = pytest.mark.django_db


def log(client, client_id: str = "c-1") -> str:
    body = {"client_id": client_id, "prompt": "x = ", "completion": "1"}
    return client.post("/v1/interactions", body, format="json").json()["id"]


def test_feedback_by_strop_id_is_recorded(client_a):
    interaction_id = log(client_a)
    response = client_a.post("/v1/feedback", {"interaction_id": interaction_id, "outcome": "accepted"}, format="json")
    assert response.status_code == 200
    assert response.json() == {"index": 0, "status": "recorded", "id": interaction_id}
    detail = client_a.get(f"/v1/interactions/{interaction_id}").json()
    assert detail["feedback"]["outcome"] == "accepted"


def test_feedback_twice_is_one_row_counting_both_events(client_a):
    interaction_id = log(client_a)
    for _ in range(2):
        client_a.post("/v1/feedback", {"interaction_id": interaction_id, "outcome": "accepted"}, format="json")
    row = Feedback.objects.get()
    assert (row.outcome, row.events_received) == ("accepted", 2)


def test_latest_event_wins_even_when_it_arrives_first(client_a):
    interaction_id = log(client_a)
    newer = {"interaction_id": interaction_id, "outcome": "rejected", "occurred_at": "2026-11-21T10:00:05Z"}
    older = {"interaction_id": interaction_id, "outcome": "accepted", "occurred_at": "2026-11-21T10:00:01Z"}
    client_a.post("/v1/feedback", newer, format="json")
    client_a.post("/v1/feedback", older, format="json")
    row = Feedback.objects.get()
    assert (row.outcome, row.events_received) == ("rejected", 2)


def test_edited_keeps_the_text(client_a):
    interaction_id = log(client_a)
    client_a.post(
        "/v1/feedback", {"interaction_id": interaction_id, "outcome": "edited", "kept_text": "return 2"}, format="json"
    )
    assert Feedback.objects.get().kept_text == "return 2"


def test_feedback_before_its_interaction_waits_and_is_attached_when_it_arrives(client_a):
    response = client_a.post("/v1/feedback", {"client_id": "early", "outcome": "accepted"}, format="json")
    assert response.status_code == 202
    assert response.json()["status"] == "pending"
    assert Feedback.objects.get().interaction is None
    interaction_id = log(client_a, "early")
    row = Feedback.objects.get()
    assert str(row.interaction_id) == interaction_id and row.pending_client_id is None


def test_tenant_that_refuses_pending_feedback_gets_404(make_tenant, make_client):
    client = make_client(make_tenant("strict", accept_pending_feedback=False))
    response = client.post("/v1/feedback", {"client_id": "nope", "outcome": "accepted"}, format="json")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "unknown_interaction"
    assert Feedback.objects.count() == 0


def test_unknown_strop_id_is_404_and_stores_nothing(client_a):
    response = client_a.post(
        "/v1/feedback", {"interaction_id": "00000000-0000-4000-8000-000000000000", "outcome": "accepted"}, format="json"
    )
    assert response.status_code == 404
    assert Feedback.objects.count() == 0


def test_feedback_batch_answers_per_item(client_a):
    interaction_id = log(client_a)
    items = [
        {"interaction_id": interaction_id, "outcome": "accepted"},
        {"client_id": "later", "outcome": "rejected"},
        {"interaction_id": "00000000-0000-4000-8000-000000000000", "outcome": "accepted"},
        {"client_id": "c-1", "outcome": "rejected", "occurred_at": "2000-01-01T00:00:00Z"},
        {"outcome": "accepted"},
    ]
    body = client_a.post("/v1/feedback", {"items": items}, format="json").json()
    assert [r["status"] for r in body["results"]] == ["recorded", "pending", "rejected", "recorded", "rejected"]
    row = Feedback.objects.get(interaction_id=interaction_id)
    assert (row.outcome, row.events_received) == ("accepted", 2)


def test_pending_feedback_merges_into_feedback_recorded_meanwhile(client_a):
    """The race the sweeper exists for: pending and recorded rows for one interaction are merged."""
    feedback_ingest(
        client_a.tenant, items=[{"client_id": "race", "outcome": "rejected", "occurred_at": "2026-11-21T10:00:09Z"}]
    )
    Interaction.objects.create(
        tenant=client_a.tenant,
        client_id="race",
        source="logged",
        prompt="p",
        completion="c",
        served_at="2026-11-21T10:00:00Z",
        received_at="2026-11-21T10:00:00Z",
    )
    interaction = Interaction.objects.get(client_id="race")
    feedback_ingest(
        client_a.tenant,
        items=[{"interaction_id": str(interaction.pk), "outcome": "accepted", "occurred_at": "2026-11-21T10:00:01Z"}],
    )
    assert Feedback.objects.count() == 2
    assert sweeper_task.apply().get() == 1
    row = Feedback.objects.get()
    assert (row.interaction_id, row.outcome, row.events_received) == (interaction.pk, "rejected", 2)
    assert feedback_attach_pending(client_a.tenant) == 0


def test_one_item_naming_a_stored_interaction_is_one_statement_and_stores_what_a_batch_would(client_a):
    """The single-item fast path finds the interaction and upserts in one statement; the row is
    the one the general (batch) path writes for the same event."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    log(client_a, "one")
    log(client_a, "two")
    event = {"outcome": "edited", "kept_text": "x = 2", "occurred_at": "2026-11-21T10:00:03Z", "metadata": {"k": [1]}}
    with CaptureQueriesContext(connection) as queries:
        (result,) = feedback_ingest(client_a.tenant, items=[{"client_id": "one", **event}])
    assert result.status == "recorded" and len(queries) == 1
    feedback_ingest(client_a.tenant, items=[{"client_id": "two", **event}, {"client_id": "absent", **event}])
    fields = ("outcome", "kept_text", "occurred_at", "metadata", "events_received", "reward_weight")
    one, two = (Feedback.objects.filter(interaction__client_id=c).values(*fields).get() for c in ("one", "two"))
    assert one == two and one["metadata"] == {"k": [1]}
    older = {"client_id": "one", "outcome": "accepted", "occurred_at": "2026-11-21T10:00:01Z"}
    assert feedback_ingest(client_a.tenant, items=[older])[0].status == "recorded"
    row = Feedback.objects.get(interaction__client_id="one")
    assert (row.outcome, row.events_received) == ("edited", 2)  # the later event still wins
