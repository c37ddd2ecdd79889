"""Set-wise deletion (apps.privacy.deletion), which erase and retention delete through: what
cascades goes with the rows (feedback, persistence reports, training events), chunk by chunk, and
nothing else, another tenant's rows least of all."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.adapters.models import Adapter, BaseModel
from apps.interactions.models import Feedback, Interaction, PersistenceReport, RollupDirty
from apps.interactions.services import feedback_ingest, interactions_ingest
from apps.privacy import deletion
from apps.privacy.deletion import keys_delete, rows_delete
from apps.training.models import TrainingRun, TrainingRunEvent

pytestmark = pytest.mark.django_db


def _world(tenant, *, prefix: str, n: int, user: str = "dev-1") -> list[str]:
    """``n`` interactions of ``user``, each with feedback, a persistence report and a training event."""
    items = [
        {"client_id": f"{prefix}-{i}", "prefix": "a", "completion": "b", "model": "tab", "end_user_id": user,
         "opted_in": True}
        for i in range(n)
    ]  # fmt: skip
    ids = [r.id for r in interactions_ingest(tenant, items=items)]
    feedback_ingest(tenant, items=[{"interaction_id": pk, "outcome": "accepted"} for pk in ids])
    now = timezone.now()
    adapter = Adapter.objects.get_or_create(
        tenant=tenant,
        name="tab",
        defaults={"base_model": BaseModel.objects.get_or_create(name="del-base", path="/nonexistent")[0]},
    )[0]
    run = TrainingRun.objects.create(tenant=tenant, adapter=adapter, status="candidate")
    for pk in ids:
        PersistenceReport.objects.create(
            tenant=tenant, interaction_id=pk, checkpoint_s=30, occurred_at=now, received_at=now, updated_at=now
        )
    for feedback in Feedback.objects.filter(interaction_id__in=ids):
        TrainingRunEvent.objects.create(run=run, feedback=feedback, held_out=False, reward=1.0)
    return ids


def _left(tenant) -> tuple[int, int, int, int]:
    return (
        Interaction.objects.filter(tenant=tenant).count(),
        Feedback.objects.filter(tenant=tenant).count(),
        PersistenceReport.objects.filter(tenant=tenant).count(),
        TrainingRunEvent.objects.filter(run__tenant=tenant).count(),
    )


@pytest.mark.parametrize("chunk", [2, 2000])
def test_keys_delete_takes_what_cascades_chunk_by_chunk_and_nothing_else(tenant, make_tenant, monkeypatch, chunk):
    monkeypatch.setitem(deletion.CHUNK, connection.vendor, chunk)
    other = make_tenant("other")
    gone = _world(tenant, prefix="gone", n=5)
    kept = _world(tenant, prefix="kept", n=2)
    _world(other, prefix="gone", n=3)  # the same client ids in another tenant
    RollupDirty.objects.all().delete()
    with CaptureQueriesContext(connection) as queries:
        counts = keys_delete(Interaction, gone)
    assert counts["interactions.Interaction"] == 5 and counts["interactions.Feedback"] == 5
    assert counts["interactions.PersistenceReport"] == 5 and counts["training.TrainingRunEvent"] == 5
    assert _left(tenant) == (2, 2, 2, 2) and _left(other) == (3, 3, 3, 3)
    assert set(map(str, Interaction.objects.filter(tenant=tenant).values_list("id", flat=True))) == set(kept)
    # The statements come in chunks: 5 keys in 3 of 2, or in one.
    deletes = [q for q in queries.captured_queries if q["sql"].startswith('DELETE FROM "interactions_interaction"')]
    assert len(deletes) == (3 if chunk == 2 else 1)
    # Feedback went before its interactions: the rollup triggers marked their hour for a refresh.
    assert RollupDirty.objects.filter(tenant_id=tenant.pk).exists()
    assert keys_delete(Interaction, []) == {}


def test_rows_delete_takes_the_filtered_rows_and_theirs(tenant, make_tenant):
    other = make_tenant("other")
    _world(tenant, prefix="a", n=3, user="erased")
    _world(tenant, prefix="b", n=2, user="stays")
    _world(other, prefix="a", n=2, user="erased")
    counts = rows_delete(Interaction.objects.filter(tenant=tenant, end_user_id="erased"))
    assert counts["interactions.Interaction"] == 3 and counts["training.TrainingRunEvent"] == 3
    assert _left(tenant) == (2, 2, 2, 2) and _left(other) == (2, 2, 2, 2)
    assert not Interaction.objects.filter(tenant=tenant, end_user_id="erased").exists()


def test_a_row_that_arrives_during_the_delete_stays_with_its_feedback(tenant, monkeypatch):
    _world(tenant, prefix="a", n=3, user="erased")
    children_delete = deletion._children_delete
    late: list[str] = []

    def then_a_request_is_served(model, chunks):  # type: ignore[no-untyped-def]
        counts = children_delete(model, chunks)
        if model is Interaction:
            late.extend(_world(tenant, prefix="late", n=1, user="erased"))
        return counts

    monkeypatch.setattr(deletion, "_children_delete", then_a_request_is_served)
    counts = rows_delete(Interaction.objects.filter(tenant=tenant, end_user_id="erased"))
    assert counts["interactions.Interaction"] == 3 and counts["interactions.Feedback"] == 3
    assert list(map(str, Interaction.objects.filter(tenant=tenant).values_list("id", flat=True))) == late
    assert Feedback.objects.filter(interaction_id=late[0]).exists()
    if connection.vendor == "postgresql":  # the deferred foreign keys hold: nothing refers to a deleted row
        with connection.cursor() as cursor:
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")


@pytest.mark.skipif(connection.vendor != "postgresql", reason="Postgres' array literals")
def test_every_key_is_one_element_of_the_array_literal():
    keys = ["a,b", 'q"uote', "{brace}", "back\\slash", "NULL", " spaced ", ""]
    with connection.cursor() as cursor:
        cursor.execute("SELECT %s::text[]", ["{" + ",".join(map(deletion._element, keys)) + "}"])
        assert cursor.fetchone()[0] == keys
