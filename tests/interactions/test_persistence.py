"""Persistence reports: what is left of an accepted completion at checkpoints after the accept,
measured as retained characters. Late, repeated and out-of-order reports are taken as feedback is;
served and logged completions alike; an editor key reports only on what it served."""

from __future__ import annotations

import uuid

import pytest
from django.utils import timezone

from apps.adapters.models import Adapter, BaseModel
from apps.interactions.models import PersistenceReport
from apps.interactions.served import ServedCompletion, interactions_record_served
from apps.interactions.services import persistence_attach_pending, persistence_ingest
from apps.serving.services import served_by
from apps.tenants.services import api_key_create
from workers.ingest import feedback_attach_pending_all as sweeper_task

pytestmark = pytest.mark.django_db

COMPLETION = "return sorted(items)"
URL = "/v1/feedback/persistence"


def log(client, client_id: str = "c-1", completion: str = COMPLETION) -> str:
    body = {"client_id": client_id, "prompt": "def f(items):\n    ", "completion": completion}
    return client.post("/v1/interactions", body, format="json").json()["id"]


def report(client, **fields):
    return client.post(URL, fields, format="json")


def test_a_report_of_the_text_at_the_insertion_point_is_measured_and_stored(client_a):
    interaction_id = log(client_a)
    response = report(client_a, interaction_id=interaction_id, checkpoint_s=30, text="return sorted(items)[:3]")
    assert response.status_code == 200, response.content
    assert response.json() == {
        "index": 0,
        "status": "recorded",
        "id": interaction_id,
        "checkpoint_s": 30,
        "accepted_chars": len(COMPLETION),
        "retained_chars": len(COMPLETION),
    }
    row = PersistenceReport.objects.get()
    assert (row.retained_chars, row.accepted_chars, row.pending_text) == (len(COMPLETION), len(COMPLETION), "")
    assert row.kept_text == COMPLETION
    assert row.kept_text == COMPLETION  # where it was found: what training credits token by token


def test_checkpoints_out_of_order_are_one_row_each(client_a):
    interaction_id = log(client_a)
    report(client_a, interaction_id=interaction_id, checkpoint_s=600, text="")
    report(client_a, interaction_id=interaction_id, checkpoint_s=30, text=COMPLETION)
    report(client_a, interaction_id=interaction_id, checkpoint_s=120, text="return items")
    rows = dict(PersistenceReport.objects.values_list("checkpoint_s", "retained_chars"))
    assert rows == {30: len(COMPLETION), 120: len("return items"), 600: 0}


def test_a_report_sent_twice_is_counted_once_and_the_latest_reading_wins(client_a):
    interaction_id = log(client_a)
    newer = {"interaction_id": interaction_id, "checkpoint_s": 120, "text": "", "occurred_at": "2026-11-21T10:02:05Z"}
    older = {**newer, "text": COMPLETION, "occurred_at": "2026-11-21T10:02:00Z"}
    report(client_a, **newer)
    report(client_a, **older)
    report(client_a, **newer)
    row = PersistenceReport.objects.get()
    assert (row.retained_chars, row.events_received) == (0, 3)


def test_a_report_before_its_interaction_waits_and_is_measured_when_it_arrives(client_a):
    response = report(client_a, client_id="early", checkpoint_s=30, text="x = 1\n" + COMPLETION)
    assert response.status_code == 202 and response.json()["status"] == "pending"
    row = PersistenceReport.objects.get()
    assert row.interaction is None and row.retained_chars is None
    interaction_id = log(client_a, "early")
    row.refresh_from_db()
    assert str(row.interaction_id) == interaction_id and row.pending_client_id is None
    assert (row.retained_chars, row.accepted_chars, row.pending_text) == (len(COMPLETION), len(COMPLETION), "")
    assert row.kept_text == COMPLETION


def test_a_pending_report_merges_into_the_one_recorded_meanwhile_by_the_latest_reading(client_a):
    interaction_id = log(client_a, "race")
    later = {"interaction_id": interaction_id, "checkpoint_s": 30, "text": COMPLETION}
    report(client_a, **later, occurred_at="2026-11-21T10:00:31Z")
    # A report for the same checkpoint that waited as pending while the interaction was being stored.
    PersistenceReport.objects.create(
        tenant=client_a.tenant,
        pending_client_id="race",
        checkpoint_s=30,
        pending_text="",
        occurred_at="2026-11-21T10:00:30Z",
        received_at=timezone.now(),
        updated_at=timezone.now(),
    )
    assert persistence_attach_pending(client_a.tenant) == 1
    row = PersistenceReport.objects.get()
    assert (row.retained_chars, row.events_received, row.pending_client_id) == (len(COMPLETION), 2, None)


def test_the_sweeper_attaches_a_report_the_interactions_transaction_could_not_see(client_a):
    interaction_id = log(client_a, "swept")
    PersistenceReport.objects.create(
        tenant=client_a.tenant,
        pending_client_id="swept",
        checkpoint_s=120,
        pending_text="return sorted",
        occurred_at=timezone.now(),
        received_at=timezone.now(),
        updated_at=timezone.now(),
    )
    assert sweeper_task.apply().get() == 1
    row = PersistenceReport.objects.get()
    assert (str(row.interaction_id), row.retained_chars) == (interaction_id, len("return sorted"))
    assert persistence_attach_pending(client_a.tenant) == 0


def test_a_clients_own_ratio_and_a_partial_accept_are_measured_on_what_was_accepted(client_a):
    interaction_id = log(client_a)
    ratio = report(client_a, interaction_id=interaction_id, checkpoint_s=30, retained_ratio=0.5)
    assert ratio.json()["retained_chars"] == len(COMPLETION) // 2
    partial = report(client_a, interaction_id=interaction_id, checkpoint_s=120, accepted_chars=6, text="return x")
    assert (partial.json()["accepted_chars"], partial.json()["retained_chars"]) == (6, 6)
    assert PersistenceReport.objects.get(checkpoint_s=30).reported_ratio == 0.5


def test_a_served_completion_takes_reports_as_a_logged_one(tenant, client_a):
    base = BaseModel.objects.create(name="persist-base", path="/nonexistent", family="qwen")
    adapter = Adapter.objects.create(tenant=tenant, name="tab", base_model=base, is_default=True)
    interaction_id = _served(tenant, adapter, key=None)
    response = report(client_a, interaction_id=str(interaction_id), checkpoint_s=30, text="return a - b")
    # "return a " stays; of "+ b" only " b" is there, too short a run to count
    assert response.status_code == 200 and response.json()["retained_chars"] == len("return a ")


def _served(tenant, adapter, *, key, completion: str = "return a + b") -> uuid.UUID:
    interaction_id = uuid.uuid4()
    interactions_record_served(
        tenant,
        choices=[ServedCompletion(interaction_id, completion, [1, 2, 3], [-0.1, -0.2, -0.3], "stop")],
        prompt="def add(a, b):\n    ",
        prefix="",
        suffix="",
        prompt_token_ids=[5, 6],
        model_name="tab",
        adapter_id=adapter.pk,
        adapter_version_id=None,
        experiment_id=None,
        experiment_arm="",
        end_user_id="alice",
        end_user_opted_in=True,
        served_at=timezone.now(),
        latency_ms=10.0,
        metadata={"temperature": 1.0, **served_by(key)},
    )
    return interaction_id


def test_an_editor_key_reports_only_on_what_it_served(tenant, client_a):
    from rest_framework.test import APIClient

    base = BaseModel.objects.create(name="persist-base", path="/nonexistent", family="qwen")
    adapter = Adapter.objects.create(tenant=tenant, name="tab", base_model=base, is_default=True)
    issued = api_key_create(tenant, name="editor", scopes=["editor"])
    editor = APIClient()
    editor.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.raw_key}")
    mine = _served(tenant, adapter, key=issued.api_key)
    theirs = _served(tenant, adapter, key=None)
    assert report(editor, interaction_id=str(mine), checkpoint_s=30, text="return a + b").status_code == 200
    refused = report(editor, interaction_id=str(theirs), checkpoint_s=30, text="")
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "not_found"
    assert report(editor, client_id="not-yet", checkpoint_s=30, text="").status_code == 404
    assert list(PersistenceReport.objects.values_list("interaction_id", flat=True)) == [mine]


@pytest.mark.parametrize(
    ("fields", "status", "code", "param"),
    [
        ({"checkpoint_s": 30, "text": "x"}, 400, "required", "interaction_id"),
        ({"client_id": "c-1", "text": "x"}, 400, "required", "checkpoint_s"),
        ({"client_id": "c-1", "checkpoint_s": 0, "text": "x"}, 400, "invalid", "checkpoint_s"),
        ({"client_id": "c-1", "checkpoint_s": 30}, 400, "required", "text"),
        ({"client_id": "c-1", "checkpoint_s": 30, "text": "x", "retained_ratio": 1}, 400, "required", "text"),
        ({"client_id": "c-1", "checkpoint_s": 30, "retained_ratio": 1.5}, 400, "invalid", "retained_ratio"),
        ({"client_id": "c-1", "checkpoint_s": 30, "text": "x" * 20_001}, 400, "invalid", "text"),
        ({"client_id": "c-1", "checkpoint_s": 30, "text": "x", "accepted_chars": 99}, 400, "invalid", "accepted_chars"),
        ({"client_id": "silent", "checkpoint_s": 30, "text": "x"}, 400, "nothing_to_retain", "interaction_id"),
        ({"client_id": "c-1", "checkpoint_s": 30, "text": "x", "outcome": "kept"}, 400, "unknown_field", "outcome"),
        ({"interaction_id": str(uuid.uuid4()), "checkpoint_s": 30, "text": "x"}, 404, "not_found", "interaction_id"),
    ],
    ids=[
        "no-interaction",
        "no-checkpoint",
        "checkpoint-zero",
        "no-text",
        "text-and-ratio",
        "ratio-over-one",
        "text-too-long",
        "accepted-beyond-completion",
        "empty-completion",
        "unknown-field",
        "unknown-id",
    ],
)
def test_bad_reports_are_refused_naming_the_field_and_store_nothing(client_a, fields, status, code, param):
    log(client_a)
    log(client_a, "silent", completion="")
    response = report(client_a, **fields)
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert (error["code"], error["param"]) == (code, param)
    assert not PersistenceReport.objects.exists()


def test_a_tenant_that_refuses_pending_feedback_refuses_pending_reports(make_tenant, make_client):
    client = make_client(make_tenant("strict", accept_pending_feedback=False))
    response = report(client, client_id="nope", checkpoint_s=30, text="")
    assert response.status_code == 404 and response.json()["error"]["code"] == "unknown_interaction"
    assert not PersistenceReport.objects.exists()


def test_a_batch_answers_per_item_and_merges_repeats_within_it(client_a):
    interaction_id = log(client_a)
    items = [
        {
            "interaction_id": interaction_id,
            "checkpoint_s": 30,
            "text": COMPLETION,
            "occurred_at": "2026-11-21T10:00:31Z",
        },
        {"interaction_id": interaction_id, "checkpoint_s": 30, "text": "", "occurred_at": "2026-11-21T10:00:30Z"},
        {"client_id": "later", "checkpoint_s": 30, "retained_ratio": 1},
        {"client_id": "later", "checkpoint_s": 30},
    ]
    body = client_a.post(URL, {"items": items}, format="json").json()
    assert (body["recorded"], body["pending"], body["rejected"]) == (2, 1, 1)
    assert body["results"][3]["error"]["field"] == "text"
    row = PersistenceReport.objects.get(interaction__isnull=False)
    assert (row.retained_chars, row.events_received) == (len(COMPLETION), 2)


def test_the_service_takes_the_same_items_as_the_endpoint(tenant, client_a):
    log(client_a, "svc")
    (result,) = persistence_ingest(tenant, items=[{"client_id": "svc", "checkpoint_s": 600, "text": "sorted(items)"}])
    assert (result.status, result.as_dict()["retained_chars"]) == ("recorded", len("sorted(items)"))


def test_erasing_a_user_deletes_their_reports_and_no_one_elses(client_a):
    for client_id, user in (("gone-1", "gone"), ("stays-1", "stays")):
        body = {"client_id": client_id, "prompt": "p", "completion": COMPLETION, "end_user_id": user, "opted_in": True}
        client_a.post("/v1/interactions", body, format="json")
        report(client_a, client_id=client_id, checkpoint_s=30, text=COMPLETION)
    preview = client_a.get("/v1/users/gone").status_code
    assert preview == 200
    response = client_a.delete("/v1/users/gone")
    assert response.status_code == 200, response.content
    assert response.json()["deleted"]["persistence_reports"] == 1
    assert list(PersistenceReport.objects.values_list("interaction__client_id", flat=True)) == ["stays-1"]


def test_a_batch_with_more_text_than_one_request_may_measure_is_refused_whole(client_a, settings):
    log(client_a)
    items = [{"client_id": "c-1", "checkpoint_s": 30 + n, "text": "x" * 20_000} for n in range(101)]
    response = client_a.post(URL, {"items": items}, format="json")
    assert response.status_code == 413 and response.json()["error"]["code"] == "payload_too_large"
    assert not PersistenceReport.objects.exists()


def test_the_interaction_read_endpoint_gives_its_retained_characters_by_checkpoint(client_a, make_tenant, make_client):
    interaction_id = log(client_a)
    url = f"/v1/interactions/{interaction_id}/persistence"
    empty = client_a.get(url)
    assert empty.status_code == 200, empty.content
    assert empty.json() == {
        "interaction_id": interaction_id,
        "accepted_chars": None,
        "retained_chars": None,
        "latest_checkpoint_s": None,
        "reports": [],
    }
    report(client_a, interaction_id=interaction_id, checkpoint_s=600, text="return items")
    report(client_a, interaction_id=interaction_id, checkpoint_s=30, text=COMPLETION)
    report(
        client_a,
        interaction_id=interaction_id,
        checkpoint_s=600,
        text="return items",
        occurred_at="2000-01-01T00:00:00Z",
    )
    body = client_a.get(url).json()
    assert (body["accepted_chars"], body["retained_chars"], body["latest_checkpoint_s"]) == (
        len(COMPLETION),
        len("return items"),
        600,
    )
    checkpoints = [(r["checkpoint_s"], r["retained_chars"], r["retained_share"]) for r in body["reports"]]
    assert checkpoints == [(30, len(COMPLETION), 1.0), (600, 12, 12 / len(COMPLETION))]
    # Tenants are walls: another tenant's key finds nothing there.
    other = make_client(make_tenant("other-persist"), scopes=["ingest"])
    assert other.get(url).status_code == 404
    assert client_a.get("/v1/interactions/not-a-uuid/persistence").status_code in (400, 404)
