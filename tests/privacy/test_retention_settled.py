"""The hours retention has settled (apps.interactions.rollups.rollups_settled_before): what it deleted
there is in the ledger for good, so an interaction served then is refused, even sent again while a
pass deletes it, and a label on one retention deleted is refused rather than kept pending; a label
written while a pass deletes its interaction is answered as that interaction is once it is gone."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

import apps.privacy.retention as retention
from apps.adapters.models import Adapter, AdapterVersion, BaseModel
from apps.experiments.models import Experiment
from apps.interactions.models import Feedback, Interaction, InteractionRollup, PersistenceReport
from apps.interactions.rollups import rollups_refresh
from apps.interactions.services import feedback_ingest, interactions_ingest
from apps.privacy.retention import retention_prune
from tests.fixtures.locks import held_in_a_thread, wait_for_a_waiting_lock

pytestmark = pytest.mark.django_db


def _item(client_id: str, *, days_ago: float) -> dict[str, Any]:
    served = (timezone.now() - timedelta(days=days_ago)).isoformat()
    return {"client_id": client_id, "prefix": "a", "completion": "b", "served_at": served}


def _hourly_requests(tenant) -> int:
    return sum(r.requests for r in InteractionRollup.objects.filter(tenant=tenant, period="hour"))


def test_an_interaction_sent_again_after_retention_deleted_it_is_refused_and_counted_once(tenant, make_client):
    tenant.retention_days = 30
    tenant.save()
    assert interactions_ingest(tenant, items=[_item("c1", days_ago=40)])[0].status == "created"
    rollups_refresh(tenant.pk)
    assert retention_prune(tenant).deleted["interactions"] == 1
    (again,) = interactions_ingest(tenant, items=[_item("c1", days_ago=40)])
    assert again.status == "rejected" and again.error is not None
    assert (again.error["code"], again.error["field"]) == ("invalid", "served_at")
    assert not Interaction.objects.filter(tenant=tenant).exists()
    rollups_refresh(tenant.pk)
    retention_prune(tenant)
    rollups_refresh(tenant.pk)
    assert _hourly_requests(tenant) == 1  # the ledger's, once
    # A longer retention later brings nothing back: the hours retention settled stay settled.
    tenant.retention_days = 90
    tenant.save()
    client = make_client(tenant)
    one = client.post("/v1/interactions", _item("c2", days_ago=60), format="json")
    assert one.status_code == 400, one.content
    assert (one.json()["error"]["code"], one.json()["error"]["param"]) == ("invalid", "served_at")
    assert "retention" in one.json()["error"]["message"]
    batch = client.post(
        "/v1/interactions", {"items": [_item("c1", days_ago=40), _item("c3", days_ago=20)]}, format="json"
    )
    assert batch.status_code == 207
    assert [r["status"] for r in batch.json()["results"]] == ["rejected", "created"]
    assert list(Interaction.objects.filter(tenant=tenant).values_list("client_id", flat=True)) == ["c3"]


def test_an_old_interaction_retention_keeps_is_still_a_duplicate_when_sent_again(tenant):
    base = BaseModel.objects.create(name="settled-base", path="/nonexistent", family="qwen")
    adapter = Adapter.objects.create(tenant=tenant, name="tab", base_model=base, is_default=True)
    version = AdapterVersion.objects.create(
        tenant=tenant, adapter=adapter, number=1, artifact_path="/v1", vllm_name="s--v1", status="in_experiment"
    )
    experiment = Experiment.objects.create(
        tenant=tenant, adapter=adapter, candidate_version=version, created_by="test", status="running", salt="s"
    )
    (kept,) = interactions_ingest(tenant, items=[_item("kept", days_ago=50)])
    Interaction.objects.filter(pk=kept.id).update(experiment=experiment, experiment_arm="candidate")
    interactions_ingest(tenant, items=[_item("gone", days_ago=50)])
    tenant.retention_days = 30
    tenant.save()
    assert retention_prune(tenant).deleted["interactions"] == 1
    # Both before the settled hours: the one the running experiment keeps is found, the other refused.
    verdicts = interactions_ingest(tenant, items=[_item("kept", days_ago=50), _item("gone", days_ago=50)])
    assert [(v.status, v.id) for v in verdicts] == [("duplicate", kept.id), ("rejected", None)]


def test_a_late_label_on_an_interaction_retention_deleted_is_refused_not_kept_pending(tenant, make_client):
    client = make_client(tenant)
    old = timezone.now() - timedelta(days=40)
    interactions_ingest(tenant, items=[_item("gone", days_ago=40)])
    tenant.retention_days = 30
    tenant.save()
    assert retention_prune(tenant).deleted["interactions"] == 1
    when = (old + timedelta(seconds=5)).isoformat()
    label = {"client_id": "gone", "outcome": "edited", "kept_text": "USER CODE", "occurred_at": when}
    response = client.post("/v1/feedback", label, format="json")
    assert response.status_code == 404, response.content
    assert response.json()["error"]["code"] == "unknown_interaction"
    assert "retention" in response.json()["error"]["message"]
    report = {"client_id": "gone", "checkpoint_s": 30, "text": "USER CODE", "occurred_at": when}
    response = client.post("/v1/feedback/persistence", report, format="json")
    assert response.status_code == 404 and response.json()["error"]["code"] == "unknown_interaction"
    batch = client.post(
        "/v1/feedback", {"items": [label, {"client_id": "not-yet", "outcome": "accepted"}]}, format="json"
    )
    assert [r["status"] for r in batch.json()["results"]] == ["rejected", "pending"]
    assert list(Feedback.objects.filter(tenant=tenant).values_list("pending_client_id", flat=True)) == ["not-yet"]
    assert not PersistenceReport.objects.filter(tenant=tenant).exists()
    # Without occurred_at nothing says how old it is: it waits, as any early label, until retention.
    undated = client.post("/v1/feedback", {"client_id": "gone", "outcome": "accepted"}, format="json")
    assert undated.status_code == 202


def _deleting(tenant, monkeypatch: pytest.MonkeyPatch):
    """A retention pass, in a thread, holding its first batch's transaction (its rows deleted, their
    ledger written) until some session waits for a lock."""

    def hold(holding) -> None:
        deleted = retention.keys_delete

        def paused(model, keys):
            counts = deleted(model, keys)
            if not holding.is_set():
                holding.set()
                wait_for_a_waiting_lock()
            return counts

        with monkeypatch.context() as patched:
            patched.setattr(retention, "keys_delete", paused)
            retention_prune(tenant)

    return hold


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row and advisory locks between connections: Postgres")
@pytest.mark.django_db(transaction=True)
def test_an_interaction_sent_again_while_the_pass_deletes_it_is_refused_not_counted_twice(make_tenant, monkeypatch):
    tenant = make_tenant("settled-race")
    interactions_ingest(tenant, items=[_item("c1", days_ago=40)])
    rollups_refresh(tenant.pk)
    tenant.retention_days = 30
    tenant.save()
    with held_in_a_thread(_deleting(tenant, monkeypatch)):
        (again,) = interactions_ingest(tenant, items=[_item("c1", days_ago=40)])  # waits for the batch
    assert again.status == "rejected", again
    rollups_refresh(tenant.pk)
    retention_prune(tenant)
    rollups_refresh(tenant.pk)
    assert _hourly_requests(tenant) == 1


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks between connections: Postgres")
@pytest.mark.django_db(transaction=True)
def test_a_label_batch_written_while_the_pass_deletes_its_interaction_answers_it_gone_and_stores_the_rest(
    make_tenant, make_client, monkeypatch
):
    tenant = make_tenant("settled-labels")
    client = make_client(tenant)
    (old,) = interactions_ingest(tenant, items=[_item("old", days_ago=40)])
    (recent,) = interactions_ingest(tenant, items=[_item("recent", days_ago=2)])
    feedback_ingest(tenant, items=[{"interaction_id": old.id, "outcome": "accepted"}])
    tenant.retention_days = 30
    tenant.save()
    labels = [{"interaction_id": old.id, "outcome": "rejected"}, {"client_id": "recent", "outcome": "accepted"}]
    with held_in_a_thread(_deleting(tenant, monkeypatch)):
        response = client.post("/v1/feedback", {"items": labels}, format="json")  # waits for the batch
    assert response.status_code == 207, response.content
    results = response.json()["results"]
    assert [r["status"] for r in results] == ["rejected", "recorded"]
    assert results[0]["error"]["code"] == "not_found"
    assert recent.id is not None
    assert list(Feedback.objects.filter(tenant=tenant).values_list("interaction_id", flat=True)) == [
        uuid.UUID(recent.id)
    ]
