"""What arrives after an erase for what it removed (apps.cohorts.erased): late labels are refused
instead of waiting as pending, out of any later erase's reach; a serving failure or a failed
stream's feedback is still erasable; an interaction sent again is refused too; an erase waits for a
run fixing its window, and for labels being written on its interactions (a label written while it
deletes them is answered as erased)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from apps.adapters.services import adapter_create, base_model_register
from apps.cohorts.erased import ERASED_IDS_KEPT, erased_digest, erased_ids_expire
from apps.cohorts.models import ErasedId
from apps.interactions.models import ConversationOutcome, Feedback, Interaction, PersistenceReport, ServingFailure
from apps.interactions.services import feedback_ingest, interactions_ingest
from apps.privacy.retention import retention_prune
from apps.privacy.selectors import end_user_erase_preview
from apps.privacy.services import end_user_erase
from apps.training.dataset import dataset_export
from apps.training.models import TrainingPolicy, TrainingRun, TrainingRunErasure, TrainingRunEvent
from tests.fixtures.locks import held_in_a_thread, wait_for_a_waiting_lock

pytestmark = pytest.mark.django_db


def _log(client: Any, client_id: str, user: str, **extra: Any) -> None:
    body = {"client_id": client_id, "completion": "secret code", "end_user_id": user, "opted_in": True}
    if "messages" not in extra:
        body["prompt"] = "p"
    response = client.post("/v1/interactions", {**body, **extra}, format="json")
    assert response.status_code == 201, response.content


def _erase(client: Any, user: str) -> dict[str, Any]:
    response = client.delete(f"/v1/users/{user}")
    assert response.status_code == 200, response.content
    return response.json()


def test_feedback_sent_after_the_erase_for_an_erased_interaction_is_refused_not_kept(client_a):
    _log(client_a, "e1", "gone")
    _erase(client_a, "gone")
    response = client_a.post(
        "/v1/feedback", {"client_id": "e1", "outcome": "edited", "kept_text": "USER CODE"}, format="json"
    )
    assert response.status_code == 410, response.content
    assert response.json()["error"]["code"] == "erased"
    assert "erased with its end user" in response.json()["error"]["message"]
    batch = client_a.post(
        "/v1/feedback",
        {"items": [{"client_id": "e1", "outcome": "accepted"}, {"client_id": "not-yet", "outcome": "accepted"}]},
        format="json",
    )
    assert batch.status_code == 207
    assert [r["status"] for r in batch.json()["results"]] == ["rejected", "pending"]
    assert batch.json()["results"][0]["error"]["code"] == "erased"
    assert list(Feedback.objects.values_list("pending_client_id", flat=True)) == ["not-yet"]


def test_a_persistence_report_sent_after_the_erase_is_refused_and_keeps_no_text(client_a):
    _log(client_a, "p1", "gone")
    assert client_a.post("/v1/feedback", {"client_id": "p1", "outcome": "accepted"}, format="json").status_code == 200
    _erase(client_a, "gone")
    response = client_a.post(
        "/v1/feedback/persistence",
        {"client_id": "p1", "checkpoint_s": 600, "text": "USER DOCUMENT secret code"},
        format="json",
    )
    assert response.status_code == 410, response.content
    assert response.json()["error"]["code"] == "erased"
    assert not PersistenceReport.objects.exists()


def test_a_session_outcome_for_an_erased_session_is_refused_until_the_session_goes_on(client_a):
    turn = {"messages": [{"role": "user", "content": "hi"}], "conversation_id": "sess-1"}
    _log(client_a, "c1", "gone", turn=0, **turn)
    _erase(client_a, "gone")
    outcome = {"conversation_id": "sess-1", "turn": 0, "outcome": "rejected"}
    response = client_a.post("/v1/feedback", outcome, format="json")
    assert response.status_code == 410, response.content
    assert not ConversationOutcome.objects.exists()
    # The user goes on with the session after the erase: new data, and its outcome is taken.
    _log(client_a, "c2", "gone", turn=1, **turn)
    assert client_a.post("/v1/feedback", {**outcome, "turn": 1}, format="json").status_code == 200
    assert ConversationOutcome.objects.filter(conversation_id="sess-1").exists()


def test_another_tenants_label_under_the_same_client_id_still_waits(client_a, make_tenant, make_client):
    _log(client_a, "shared", "gone")
    _erase(client_a, "gone")
    other = make_client(make_tenant("other"))
    response = other.post("/v1/feedback", {"client_id": "shared", "outcome": "accepted"}, format="json")
    assert response.status_code == 202, response.content
    assert Feedback.objects.filter(tenant=other.tenant, pending_client_id="shared").exists()


def test_the_erase_keeps_digests_not_ids_and_they_expire(client_a, tenant):
    _log(client_a, "e2", "gone")
    _erase(client_a, "gone")
    (digest,) = ErasedId.objects.filter(tenant=tenant).values_list("digest", flat=True)
    assert digest == erased_digest(tenant.pk, "client", "e2") != "e2" and len(digest) == 32
    assert erased_ids_expire(now=timezone.now() + ERASED_IDS_KEPT - timedelta(minutes=1)) == 0
    assert erased_ids_expire(now=timezone.now() + ERASED_IDS_KEPT + timedelta(minutes=1)) == 1
    # Past that, a label for the id waits as any early one does.
    assert client_a.post("/v1/feedback", {"client_id": "e2", "outcome": "accepted"}, format="json").status_code == 202


def test_a_serving_failure_alone_is_erasable(client_a, tenant, tiny_starter_model):
    base = base_model_register(name="base", path=tiny_starter_model)
    adapter = adapter_create(tenant, name="tab", base_model=base, is_default=True)
    ServingFailure.objects.create(
        tenant=tenant, adapter=adapter, end_user_id="ghost", kind="vllm_error", message="m", occurred_at=timezone.now()
    )
    assert _erase(client_a, "ghost")["deleted"]["serving_failures"] == 1
    assert client_a.delete("/v1/users/ghost").status_code == 404  # nothing left of them now


def test_retention_drops_session_outcomes_no_kept_turn_carries(tenant):
    old = timezone.now() - timedelta(days=40)
    fields = {"turn": 0, "outcome": "rejected", "occurred_at": old, "received_at": old, "updated_at": old}
    lonely = ConversationOutcome.objects.create(tenant=tenant, conversation_id="never-came", **fields)
    waiting = ConversationOutcome.objects.create(  # within the retention: its turns may still come
        tenant=tenant, conversation_id="on-its-way", **{**fields, "updated_at": timezone.now()}
    )
    carried = ConversationOutcome.objects.create(tenant=tenant, conversation_id="kept", **fields)
    interactions_ingest(  # a turn that arrives now: the session's outcome is spread to it
        tenant,
        items=[{"client_id": "k1", "completion": "x", "conversation_id": "kept", "turn": 0,
                "messages": [{"role": "user", "content": "hi"}]}],
    )  # fmt: skip
    assert Feedback.objects.filter(session_outcome=carried).exists()
    tenant.retention_days = 30
    tenant.save()
    report = retention_prune(tenant)
    assert report.deleted["session_outcomes"] == 1
    assert set(ConversationOutcome.objects.values_list("pk", flat=True)) == {carried.pk, waiting.pk}
    assert not ConversationOutcome.objects.filter(pk=lonely.pk).exists()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks between two connections: Postgres")
@pytest.mark.django_db(transaction=True)
def test_an_erase_waits_for_a_run_fixing_its_window_and_names_it(tenant, tiny_starter_model, monkeypatch):
    base = base_model_register(name="base", path=tiny_starter_model)
    adapter = adapter_create(tenant, name="tab", base_model=base, is_default=True)
    policy = TrainingPolicy.objects.create(tenant=tenant, adapter=adapter, heldout_fraction=0.0)
    items = [
        {"client_id": f"w{i}", "prompt": "x = ", "completion": "1", "end_user_id": "gone", "opted_in": True}
        for i in range(3)
    ]
    interactions_ingest(tenant, items=items)
    feedback_ingest(tenant, items=[{"client_id": f"w{i}", "outcome": "accepted"} for i in range(3)])
    run = TrainingRun.objects.create(tenant=tenant, adapter=adapter, status="exporting")
    written, outcome = threading.Event(), {}
    bulk_create = TrainingRunEvent.objects.bulk_create

    def slow_bulk_create(rows: Any, **kwargs: Any) -> Any:  # the window written, not yet committed
        created = bulk_create(rows, **kwargs)
        written.set()
        time.sleep(1.0)
        return created

    monkeypatch.setattr(TrainingRunEvent.objects, "bulk_create", slow_bulk_create)

    def export() -> None:
        try:
            outcome["window"] = dataset_export(run, policy=policy)
        except Exception as exc:  # pragma: no cover - reported below
            outcome["error"] = exc
        finally:
            connection.close()

    thread = threading.Thread(target=export)
    thread.start()
    assert written.wait(60)
    report = end_user_erase(tenant, external_id="gone", actor="test")
    thread.join(60)
    assert "error" not in outcome and len(outcome["window"].train) == 3  # committed before the erase went on
    assert [r["run"] for r in report.training_runs] == [run.pk]
    assert TrainingRunErasure.objects.filter(run=run).exists()
    assert not Interaction.objects.exists() and not TrainingRunEvent.objects.exists()


def test_a_session_that_another_users_turns_share_keeps_its_outcome_for_them(client_a, tenant):
    turn = {"messages": [{"role": "user", "content": "hi"}], "conversation_id": "shared-sess"}
    _log(client_a, "mine", "gone", turn=0, **turn)
    _log(client_a, "theirs", "stays", turn=1, **turn)
    outcome = {"conversation_id": "shared-sess", "turn": 1, "outcome": "thumbs_up"}
    assert client_a.post("/v1/feedback", outcome, format="json").status_code == 200
    assert Feedback.objects.filter(interaction__client_id="theirs", session_outcome__isnull=False).exists()
    assert end_user_erase_preview(tenant, external_id="gone")["deleted"]["session_outcomes"] == 0
    report = _erase(client_a, "gone")
    assert report["deleted"]["session_outcomes"] == 0 and report["deleted"]["interactions"] == 1
    assert ConversationOutcome.objects.filter(conversation_id="shared-sess").exists()
    assert Feedback.objects.filter(interaction__client_id="theirs", session_outcome__isnull=False).exists()


@pytest.mark.django_db(transaction=True)
def test_an_erase_meeting_a_session_outcome_being_recorded_waits_instead_of_deadlocking(make_tenant, make_client):
    """Recording a session's outcome locks the outcome, then its turns' feedback
    (apps.interactions.sessions); the erase locks the user's sessions' outcomes before their turns'
    feedback goes, so it waits for the recording. Deleting the feedback first, it held the rows the
    recording wanted while waiting for the outcome the recording held: a deadlock."""
    from django.db import transaction

    tenant = make_tenant("sessions")
    client = make_client(tenant)
    turn = {"messages": [{"role": "user", "content": "hi"}], "conversation_id": "s-lock"}
    _log(client, "t0", "gone", turn=0, **turn)
    outcome = {"conversation_id": "s-lock", "turn": 0, "outcome": "thumbs_up"}
    assert client.post("/v1/feedback", outcome, format="json").status_code == 200

    def record(holding) -> None:
        with transaction.atomic():
            ConversationOutcome.objects.select_for_update().get(tenant=tenant, conversation_id="s-lock")
            holding.set()
            wait_for_a_waiting_lock()
            list(Feedback.objects.select_for_update().filter(tenant=tenant, interaction__conversation_id="s-lock"))

    with held_in_a_thread(record):  # a deadlock that aborts the recording fails the test
        report = end_user_erase(tenant, external_id="gone", actor="test")
    assert report.deleted["interactions"] == 1 and report.deleted["session_outcomes"] == 1


def test_an_interaction_recorded_while_the_erase_runs_is_kept_or_its_late_label_refused(client_a, monkeypatch):
    """What the erase deletes and the client ids it remembers as erased come from one read: a row of
    the user recorded between the two (here, just before the ids are remembered) is left whole, as one
    recorded just after the erase, never deleted with its late label left to wait as pending."""
    import apps.privacy.services as erase_module

    _log(client_a, "before", "racing")
    remember = erase_module.erased_ids_record

    def recorded_meanwhile(*args: Any, **kwargs: Any) -> Any:
        _log(client_a, "meanwhile", "racing")
        return remember(*args, **kwargs)

    monkeypatch.setattr(erase_module, "erased_ids_record", recorded_meanwhile)
    _erase(client_a, "racing")
    late = client_a.post("/v1/feedback", {"client_id": "meanwhile", "outcome": "accepted"}, format="json")
    assert Interaction.objects.filter(client_id="meanwhile").exists()  # kept whole
    assert late.status_code == 200, late.content  # its label lands on it, not pending
    assert not Feedback.objects.filter(pending_client_id="meanwhile").exists()
    gone = client_a.post("/v1/feedback", {"client_id": "before", "outcome": "accepted"}, format="json")
    assert gone.status_code == 410


def test_an_interaction_sent_again_after_the_erase_is_refused_not_stored(client_a):
    _log(client_a, "e3", "gone")
    _erase(client_a, "gone")
    body = {"client_id": "e3", "prompt": "p", "completion": "secret code", "end_user_id": "gone", "opted_in": True}
    response = client_a.post("/v1/interactions", body, format="json")
    assert response.status_code == 410, response.content
    assert response.json()["error"]["code"] == "erased"
    assert "erased with its end user" in response.json()["error"]["message"]
    batch = client_a.post("/v1/interactions", {"items": [body, {**body, "client_id": "e4"}]}, format="json")
    assert batch.status_code == 207
    assert [r["status"] for r in batch.json()["results"]] == ["rejected", "created"]
    assert batch.json()["results"][0]["error"]["code"] == "erased"
    # New data of the same user is taken; what the erase removed stays gone.
    assert list(Interaction.objects.values_list("client_id", flat=True)) == ["e4"]


def _erasing(tenant: Any, monkeypatch: pytest.MonkeyPatch, user: str):
    """An erase of ``user``, in a thread, holding its transaction (their rows deleted, their ids
    remembered) until some session waits for a lock."""
    import apps.privacy.services as erase_module

    def hold(holding: threading.Event) -> None:
        audited = erase_module.audit_record

        def paused(*args: Any, **kwargs: Any) -> Any:
            holding.set()
            wait_for_a_waiting_lock()
            return audited(*args, **kwargs)

        with monkeypatch.context() as patched:
            patched.setattr(erase_module, "audit_record", paused)
            end_user_erase(tenant, external_id=user, actor="test")

    return hold


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks between two connections: Postgres")
@pytest.mark.django_db(transaction=True)
def test_a_label_batch_written_while_an_erase_deletes_its_interaction_answers_it_erased_and_stores_the_rest(
    make_tenant, make_client, monkeypatch
):
    tenant = make_tenant("erase-meanwhile")
    client = make_client(tenant)
    _log(client, "e5", "gone")
    _log(client, "s1", "stays")
    labels = [{"client_id": "e5", "outcome": "accepted"}, {"client_id": "s1", "outcome": "accepted"}]
    with held_in_a_thread(_erasing(tenant, monkeypatch, "gone")):
        response = client.post("/v1/feedback", {"items": labels}, format="json")  # waits for the erase
    assert response.status_code == 207, response.content
    results = response.json()["results"]
    assert [r["status"] for r in results] == ["rejected", "recorded"]
    assert results[0]["error"]["code"] == "erased"
    assert list(Feedback.objects.values_list("interaction__client_id", flat=True)) == ["s1"]
    assert not Interaction.objects.filter(end_user_id="gone").exists()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks between two connections: Postgres")
@pytest.mark.django_db(transaction=True)
def test_an_erase_meeting_labels_being_written_waits_for_them_and_deletes_them_too(make_tenant, make_client):
    from django.db import transaction

    tenant = make_tenant("erase-waits")
    client = make_client(tenant)
    _log(client, "e6", "gone")
    _log(client, "e7", "gone")

    def label(holding: threading.Event) -> None:
        with transaction.atomic():
            items = [{"client_id": "e6", "outcome": "accepted"}, {"client_id": "e7", "outcome": "rejected"}]
            assert [r.status for r in feedback_ingest(tenant, items=items)] == ["recorded", "recorded"]
            holding.set()
            wait_for_a_waiting_lock()  # the erase waits for these labels

    with held_in_a_thread(label):
        report = end_user_erase(tenant, external_id="gone", actor="test")
    assert report.deleted["interactions"] == 2 and report.deleted["feedback"] == 2
    assert not Feedback.objects.exists() and not Interaction.objects.exists()


@pytest.mark.skipif(connection.vendor != "postgresql", reason="row locks between two connections: Postgres")
@pytest.mark.django_db(transaction=True)
def test_a_session_outcome_sent_while_an_erase_deletes_its_turns_lands_on_none_of_them(
    make_tenant, make_client, monkeypatch
):
    tenant = make_tenant("erase-session-meanwhile")
    client = make_client(tenant)
    _log(client, "t1", "gone", turn=0, messages=[{"role": "user", "content": "hi"}], conversation_id="s-race")
    outcome = {"conversation_id": "s-race", "turn": 0, "outcome": "thumbs_up"}
    with held_in_a_thread(_erasing(tenant, monkeypatch, "gone")):
        response = client.post("/v1/feedback", outcome, format="json")  # its spread waits for the erase
    assert response.status_code == 200, response.content
    assert not Feedback.objects.exists() and not Interaction.objects.exists()
