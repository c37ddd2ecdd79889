"""Retention: a tenant's setting, bounded by the operator's maximum, and a pass that deletes what
is older, keeps what a running experiment or a training window needs, and says what it removed."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from apps.adapters.models import Adapter, AdapterVersion, BaseModel
from apps.experiments.models import Experiment
from apps.interactions.models import (
    ConversationOutcome,
    Feedback,
    Interaction,
    InteractionRollup,
    PersistenceReport,
    RollupDirty,
    ServingFailure,
)
from apps.interactions.rollups import rollups_refresh
from apps.interactions.services import feedback_ingest, interactions_ingest
from apps.privacy.purge import tainted_versions
from apps.privacy.retention import retention_prune, retention_prune_all
from apps.privacy.services import end_user_erase
from apps.tenants.models import AuditEvent
from apps.training.models import TrainingRun, TrainingRunEvent

pytestmark = pytest.mark.django_db


def _log(tenant, *, prefix: str, days_ago: float, n: int = 3, model: str = "tab", user: str = "dev-1") -> list[str]:
    served = (timezone.now() - timedelta(days=days_ago)).isoformat()
    items = [
        {
            "client_id": f"{prefix}-{i}",
            "prefix": "a",
            "completion": "b",
            "model": model,
            "end_user_id": user,
            "opted_in": True,
            "served_at": served,
        }
        for i in range(n)
    ]
    ids = [r.id for r in interactions_ingest(tenant, items=items)]
    feedback_ingest(tenant, items=[{"interaction_id": pk, "outcome": "accepted"} for pk in ids])
    return ids


@pytest.fixture
def adapter(tenant):
    base = BaseModel.objects.create(name="ret-base", path="/nonexistent", family="qwen")
    return Adapter.objects.create(tenant=tenant, name="tab", base_model=base, is_default=True)


def test_old_interactions_go_recent_ones_stay_and_the_pass_says_what_it_removed(tenant, adapter):
    old, recent = _log(tenant, prefix="old", days_ago=40), _log(tenant, prefix="new", days_ago=2)
    at = timezone.now() - timedelta(days=40)
    PersistenceReport.objects.create(  # what the editor kept of an old suggestion goes with it
        tenant=tenant, interaction_id=old[0], checkpoint_s=30, occurred_at=at, received_at=at, updated_at=at
    )
    rollups_refresh(tenant.pk)
    tenant.retention_days = 30
    tenant.save()
    report = retention_prune(tenant)
    assert report.deleted["interactions"] == 3 and report.deleted["feedback"] == 3
    assert report.deleted["persistence_reports"] == 1
    assert set(map(str, Interaction.objects.filter(tenant=tenant).values_list("id", flat=True))) == set(recent)
    assert not Feedback.objects.filter(interaction_id__in=old).exists()
    event = AuditEvent.objects.get(tenant=tenant, action="retention.prune")
    assert event.data["deleted"]["interactions"] == 3
    # The rollups outlive the raw rows: the old hour is still charted, and a refresh keeps it.
    rollups_refresh(tenant.pk)
    assert InteractionRollup.objects.filter(tenant=tenant, period="hour").count() == 2
    assert sum(r.requests for r in InteractionRollup.objects.filter(tenant=tenant, period="day")) == 6
    assert retention_prune(tenant).deleted["interactions"] == 0  # nothing left to remove


def test_a_running_experiment_and_a_pending_training_window_survive_a_retention_pass(tenant, adapter):
    version = AdapterVersion.objects.create(
        tenant=tenant,
        adapter=adapter,
        number=1,
        artifact_path="/nonexistent/v1",
        vllm_name="t--tab--v1",
        status="in_experiment",
    )
    experiment = Experiment.objects.create(
        tenant=tenant, adapter=adapter, candidate_version=version, created_by="test", status="running", salt="s"
    )
    in_experiment = _log(tenant, prefix="exp", days_ago=50)
    Interaction.objects.filter(pk__in=in_experiment).update(experiment=experiment, experiment_arm="candidate")
    in_window = _log(tenant, prefix="win", days_ago=50)
    run = TrainingRun.objects.create(tenant=tenant, adapter=adapter, status="training")
    for feedback in Feedback.objects.filter(interaction_id__in=in_window):
        TrainingRunEvent.objects.create(run=run, feedback=feedback, held_out=False, reward=0.75)
    plain = _log(tenant, prefix="plain", days_ago=50)
    tenant.retention_days = 30
    tenant.save()
    report = retention_prune(tenant)
    left = set(map(str, Interaction.objects.filter(tenant=tenant).values_list("id", flat=True)))
    assert left == set(in_experiment) | set(in_window)
    assert report.deleted["interactions"] == len(plain)
    assert TrainingRunEvent.objects.filter(run=run).count() == 3
    # Once the experiment ends and the run fails, their old rows go at the next pass.
    Experiment.objects.filter(pk=experiment.pk).update(status="stopped")
    TrainingRun.objects.filter(pk=run.pk).update(status="failed")
    assert retention_prune(tenant).deleted["interactions"] == 6


def test_a_queued_run_keeps_its_adapters_old_events_until_its_window_is_fixed(tenant, adapter):
    _log(tenant, prefix="q", days_ago=50)
    TrainingRun.objects.create(tenant=tenant, adapter=adapter, status="queued")
    tenant.retention_days = 30
    tenant.save()
    assert retention_prune(tenant).deleted["interactions"] == 0


def test_the_operator_maximum_bounds_every_tenant(tenant, adapter, settings, make_client):
    settings.STROP_RETENTION_MAX_DAYS = 60
    _log(tenant, prefix="x", days_ago=70)
    _log(tenant, prefix="y", days_ago=10)
    assert retention_prune_all()[tenant.slug].deleted["interactions"] == 3  # no setting of its own: the maximum
    client = make_client(tenant)
    refused = client.patch("/v1/tenant", {"retention_days": 90}, format="json")
    assert refused.status_code == 400 and "at most 60" in refused.json()["error"]["message"]
    assert client.patch("/v1/tenant", {"retention_days": 0}, format="json").status_code == 400
    ok = client.patch("/v1/tenant", {"retention_days": 7}, format="json")
    assert ok.status_code == 200 and ok.json()["retention_days"] == 7
    assert retention_prune(tenant).deleted["interactions"] == 3


def test_no_retention_deletes_nothing(tenant, adapter):
    _log(tenant, prefix="z", days_ago=400)
    assert retention_prune(tenant).cutoff is None and Interaction.objects.filter(tenant=tenant).count() == 3


def _version(tenant, adapter, number: int, *, status: str, parent=None) -> AdapterVersion:
    return AdapterVersion.objects.create(
        tenant=tenant,
        adapter=adapter,
        number=number,
        parent=parent,
        artifact_path=f"/nonexistent/ret-v{number}",
        vllm_name=f"t--tab--v{number}",
        status=status,
    )


def _trained(tenant, adapter, version, ids: list[str]) -> TrainingRun:
    run = TrainingRun.objects.create(tenant=tenant, adapter=adapter, status="candidate", output_version=version)
    for feedback in Feedback.objects.filter(interaction_id__in=ids):
        TrainingRunEvent.objects.create(run=run, feedback=feedback, held_out=False, reward=1.0)
    return run


def _counted(client, kind: str, tenant) -> float:
    """``strop_retention_deleted_total`` for ``kind`` and ``tenant``, read from ``/metrics`` (the
    test client is a loopback caller)."""
    from prometheus_client.parser import text_string_to_metric_families

    response = client.get("/metrics")
    assert response.status_code == 200, response.content
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            if sample.name == "strop_retention_deleted_total" and sample.labels == {
                "kind": kind,
                "tenant": tenant.slug,
            }:
                return sample.value
    return 0.0


def test_an_ancestor_of_a_live_version_keeps_its_window_so_a_later_erase_still_taints_its_heirs(
    tenant, adapter, client
):
    v1 = _version(tenant, adapter, 1, status="retired")
    v2 = _version(tenant, adapter, 2, status="production", parent=v1)
    _trained(tenant, adapter, v1, _log(tenant, prefix="v1", days_ago=50, user="only-in-v1"))
    _trained(tenant, adapter, v2, _log(tenant, prefix="v2", days_ago=5, user="dev-2"))
    gone = _version(tenant, adapter, 3, status="purged")
    _trained(tenant, adapter, gone, _log(tenant, prefix="gone", days_ago=50, user="dev-3"))
    tenant.retention_days = 30
    tenant.save()
    before = _counted(client, "training_window_events", tenant)
    report = retention_prune(tenant)
    assert report.deleted["interactions"] == 3  # only the purged version's window goes
    # ... and says so: its window's rows, in the audit entry and on /metrics.
    assert report.deleted["training_window_events"] == 3
    event = AuditEvent.objects.get(tenant=tenant, action="retention.prune")
    assert event.data["deleted"]["training_window_events"] == 3
    assert _counted(client, "training_window_events", tenant) == before + 3
    end_user_erase(tenant, external_id="only-in-v1", actor="test")
    assert tainted_versions(adapter) == {v1.pk, v2.pk}


def test_pending_persistence_reports_older_than_the_cutoff_go_and_are_counted(tenant, adapter):
    def pending(client_id: str, days_ago: float) -> None:
        at = timezone.now() - timedelta(days=days_ago)
        PersistenceReport.objects.create(
            tenant=tenant,
            pending_client_id=client_id,
            checkpoint_s=30,
            pending_text="user code " * 100,
            occurred_at=at,
            received_at=at,
            updated_at=at,
        )

    pending("old", 40)
    pending("recent", 2)
    tenant.retention_days = 30
    tenant.save()
    report = retention_prune(tenant)
    assert report.deleted["pending_persistence_reports"] == 1
    assert list(PersistenceReport.objects.filter(tenant=tenant).values_list("pending_client_id", flat=True)) == [
        "recent"
    ]
    event = AuditEvent.objects.get(tenant=tenant, action="retention.prune")
    assert event.data["deleted"]["pending_persistence_reports"] == 1


def test_one_tenants_failure_is_logged_and_the_pass_goes_on_to_the_next(make_tenant, caplog, monkeypatch):
    import apps.privacy.retention as retention

    broken, good = make_tenant("broken"), make_tenant("good")  # in this order: the pass walks by id
    broken.retention_days = 30
    broken.save()
    real = retention._deletable

    def deletable(tenant, cutoff):  # type: ignore[no-untyped-def]
        if tenant.pk == broken.pk:
            raise RuntimeError("the database refused this tenant's query")
        return real(tenant, cutoff)

    monkeypatch.setattr(retention, "_deletable", deletable)
    _log(good, prefix="old", days_ago=40)
    good.retention_days = 30
    good.save()
    with caplog.at_level("ERROR", logger="apps.privacy.retention"):
        reports = retention_prune_all()
    assert reports[good.slug].deleted["interactions"] == 3 and broken.slug not in reports
    assert any(str(broken.pk) in r.getMessage() and r.exc_info for r in caplog.records)


def test_an_old_hour_without_rollups_is_rolled_up_before_its_rows_go(tenant, adapter):
    # An install upgraded from before rollups whose refresh has not reached this hour yet.
    _log(tenant, prefix="old", days_ago=40)
    RollupDirty.objects.filter(tenant_id=tenant.pk).delete()
    tenant.retention_days = 30
    tenant.save()
    assert retention_prune(tenant).deleted["interactions"] == 3
    rollups_refresh(tenant.pk)
    assert sum(r.requests for r in InteractionRollup.objects.filter(tenant=tenant, period="hour")) == 3
    assert sum(r.requests for r in InteractionRollup.objects.filter(tenant=tenant, period="day")) == 3


def test_the_pass_walks_old_rows_by_keyset_and_excludes_kept_ones_with_not_exists(tenant, adapter):
    # Kept rows (a live version's window) interleaved with rows that go, in batches of 2: every row
    # that may go goes, none kept does, and no batch reads rows before the last one it deleted.
    version = _version(tenant, adapter, 1, status="production")
    kept = []
    for day in range(40, 50):
        ids = _log(tenant, prefix=f"d{day}", days_ago=day, n=2)
        kept.append(ids[0])
    _trained(tenant, adapter, version, kept)
    tenant.retention_days = 30
    tenant.save()
    with CaptureQueriesContext(connection) as queries:
        report = retention_prune(tenant, batch=2)
    assert report.deleted["interactions"] == 10
    assert set(map(str, Interaction.objects.filter(tenant=tenant).values_list("id", flat=True))) == set(kept)
    batches = [q["sql"] for q in queries if q["sql"].startswith('SELECT "interactions_interaction"."served_at"')]
    assert len(batches) == 6  # 5 of 2, and the empty one that ends the walk
    assert all("NOT EXISTS" in sql and "NOT IN" not in sql.upper().replace("NOT (", "") for sql in batches)
    assert all('"interactions_interaction"."served_at" >' in sql for sql in batches[1:])


def test_what_hangs_off_an_old_interaction_goes_with_it_set_by_set(tenant, adapter):
    # Its feedback, its persistence report and its feedback's place in a purged version's window go
    # with it (each table in one statement); another interaction's stay.
    old, recent = _log(tenant, prefix="old", days_ago=40, n=2), _log(tenant, prefix="new", days_ago=2, n=1)
    at = timezone.now() - timedelta(days=40)
    for pk in (*old, *recent):
        PersistenceReport.objects.create(
            tenant=tenant, interaction_id=pk, checkpoint_s=30, occurred_at=at, received_at=at, updated_at=at
        )
    run = _trained(tenant, adapter, _version(tenant, adapter, 1, status="purged"), [*old, *recent])
    tenant.retention_days = 30
    tenant.save()
    report = retention_prune(tenant)
    assert report.deleted["interactions"] == 2 and report.deleted["feedback"] == 2
    assert report.deleted["persistence_reports"] == 2 and report.deleted["training_window_events"] == 2
    assert [str(r.interaction_id) for r in PersistenceReport.objects.filter(tenant=tenant)] == recent
    assert [str(e.feedback.interaction_id) for e in TrainingRunEvent.objects.filter(run=run)] == recent


def test_the_pass_leaves_later_hours_marks_to_beat_and_old_hours_keep_their_rollups(tenant, adapter):
    # An erase (or late feedback) marks hours across the year: the pass recomputes none of them (a
    # pass must not wait for a year of hours), beat's refresh does; the dropped hour stays charted.
    old, recent = _log(tenant, prefix="old", days_ago=40), _log(tenant, prefix="new", days_ago=2)
    rollups_refresh(tenant.pk)
    Feedback.objects.filter(interaction_id=recent[0]).update(outcome="rejected")
    tenant.retention_days = 30
    tenant.save()
    assert retention_prune(tenant).deleted["interactions"] == 3
    cutoff = timezone.now() - timedelta(days=30)
    hourly = InteractionRollup.objects.filter(tenant=tenant, period="hour")
    assert RollupDirty.objects.filter(tenant_id=tenant.pk, hour__gte=cutoff).exists()  # beat's to refresh
    rollups_refresh(tenant.pk)
    assert {r.outcome: r.requests for r in hourly.filter(bucket_start__lt=cutoff)} == {"accepted": 3}
    assert {r.outcome: r.requests for r in hourly.filter(bucket_start__gte=cutoff)} == {"accepted": 2, "rejected": 1}
    assert not Interaction.objects.filter(id__in=old).exists()


def test_a_retention_longer_than_any_date_keeps_everything(tenant, adapter):
    # Stored before the bound on write (RETENTION_DAYS_MOST): no cutoff that far back, so nothing goes.
    _log(tenant, prefix="old", days_ago=40)
    type(tenant).objects.filter(pk=tenant.pk).update(retention_days=10**6)
    tenant.refresh_from_db()
    report = retention_prune(tenant)
    assert report.cutoff is None and Interaction.objects.filter(tenant=tenant).count() == 3


def test_old_pending_labels_failures_and_session_outcomes_go_in_batches_and_recent_ones_stay(tenant, adapter):
    def at(days_ago: float):
        return timezone.now() - timedelta(days=days_ago)

    for i, days_ago in enumerate([40, 40, 40, 40, 40, 2]):
        Feedback.objects.create(
            tenant=tenant,
            pending_client_id=f"p-{i}",
            outcome="accepted",
            occurred_at=at(days_ago),
            received_at=at(days_ago),
            updated_at=at(days_ago),
        )
        ConversationOutcome.objects.create(
            tenant=tenant,
            conversation_id=f"s-{i}",
            turn=0,
            outcome="thumbs_up",
            occurred_at=at(days_ago),
            received_at=at(days_ago),
            updated_at=at(days_ago),
        )
        ServingFailure.objects.create(
            tenant=tenant,
            adapter=adapter,
            end_user_id="dev-1",
            kind="upstream_error",
            occurred_at=at(days_ago),
        )
    # A label first sent before the cutoff and sent again since is as recent as its last event.
    Feedback.objects.create(
        tenant=tenant,
        pending_client_id="p-resent",
        outcome="rejected",
        occurred_at=at(2),
        received_at=at(40),
        updated_at=at(2),
        events_received=2,
    )
    tenant.retention_days = 30
    tenant.save()
    report = retention_prune(tenant, batch=2)  # three batches each, the last one short
    assert report.deleted["pending_feedback"] == 5
    assert report.deleted["session_outcomes"] == 5
    assert report.deleted["serving_failures"] == 5
    kept = Feedback.objects.filter(tenant=tenant).order_by("pending_client_id")
    assert list(kept.values_list("pending_client_id", flat=True)) == ["p-5", "p-resent"]
    assert list(ConversationOutcome.objects.filter(tenant=tenant).values_list("conversation_id", flat=True)) == ["s-5"]
    assert ServingFailure.objects.filter(tenant=tenant).count() == 1
    assert retention_prune(tenant, batch=2).deleted == dict.fromkeys(report.deleted, 0)


def test_a_run_that_registers_its_version_during_a_pass_keeps_its_window_in_the_batches_after(
    tenant, adapter, monkeypatch
):
    """What a pass must keep is read again each batch: a run active when the pass began, that
    registered a version between two batches, keeps its window as that live version's."""
    import apps.privacy.retention as retention

    _log(tenant, prefix="plain", days_ago=60)  # the oldest: the first batches take them
    window = _log(tenant, prefix="window", days_ago=50, user="dev-2")
    run = TrainingRun.objects.create(tenant=tenant, adapter=adapter, status="evaluating")
    for feedback in Feedback.objects.filter(interaction_id__in=window):
        TrainingRunEvent.objects.create(run=run, feedback=feedback, held_out=False, reward=1.0)
    tenant.retention_days = 30
    tenant.save()
    delete = retention.keys_delete

    def then_the_run_registers(model, keys):
        counts = delete(model, keys)
        if not TrainingRun.objects.filter(pk=run.pk, output_version__isnull=False).exists():
            version = _version(tenant, adapter, 1, status="candidate")
            TrainingRun.objects.filter(pk=run.pk).update(status="candidate", output_version=version)
        return counts

    monkeypatch.setattr(retention, "keys_delete", then_the_run_registers)
    report = retention_prune(tenant, batch=1)
    assert report.deleted["interactions"] == 3 and report.deleted["training_window_events"] == 0
    assert set(map(str, Interaction.objects.filter(tenant=tenant).values_list("id", flat=True))) == set(window)


@pytest.mark.django_db(transaction=True)
def test_a_pending_label_attached_while_the_pass_waits_for_it_stays(make_tenant):
    """The pass locks a batch of old pending labels, then reads them again: one attached to its
    interaction meanwhile (it waited for the attach's lock) is no longer pending, and stays."""

    from django.db import transaction

    from tests.fixtures.locks import held_in_a_thread, wait_for_a_waiting_lock

    tenant = make_tenant("retention-attach")
    at = timezone.now() - timedelta(days=40)
    label = Feedback.objects.create(
        tenant=tenant, pending_client_id="late-1", outcome="accepted", occurred_at=at, received_at=at, updated_at=at
    )
    # An interaction under another client id (under its own, ingest would attach the label at once;
    # the thread below attaches it as the pending sweeper does).
    item = {"client_id": "other", "prefix": "a", "completion": "b", "end_user_id": "dev-1", "opted_in": True}
    (arrived,) = interactions_ingest(tenant, items=[item])
    assert arrived.id is not None, arrived.error
    tenant.retention_days = 30
    tenant.save()

    def attach(holding) -> None:  # as apps.interactions.services.pending does: the label locked, then set
        with transaction.atomic():
            Feedback.objects.select_for_update().get(pk=label.pk)
            holding.set()
            wait_for_a_waiting_lock()  # the pass waits for this label
            Feedback.objects.filter(pk=label.pk).update(interaction_id=arrived.id, pending_client_id=None)

    with held_in_a_thread(attach):
        report = retention_prune(tenant)
    assert report.deleted["pending_feedback"] == 0
    assert Feedback.objects.filter(pk=label.pk, interaction_id=arrived.id).exists()


def test_a_pass_that_fails_part_way_records_what_its_earlier_batches_deleted(tenant, adapter, monkeypatch):
    import apps.privacy.retention as retention

    _log(tenant, prefix="old", days_ago=40)
    tenant.retention_days = 30
    tenant.save()
    delete, calls = retention.keys_delete, []

    def the_second_batch_fails(model, keys):
        calls.append(keys)
        if len(calls) == 2:
            raise RuntimeError("the database went away")
        return delete(model, keys)

    monkeypatch.setattr(retention, "keys_delete", the_second_batch_fails)
    with pytest.raises(RuntimeError):
        retention_prune(tenant, batch=1)
    event = AuditEvent.objects.get(tenant=tenant, action="retention.prune")
    assert event.data["deleted"]["interactions"] == 1 and event.data["deleted"]["feedback"] == 1
    assert event.data["error"] == "RuntimeError: the database went away"
    assert Interaction.objects.filter(tenant=tenant).count() == 2


@pytest.mark.django_db(transaction=True)
def test_a_pass_that_waits_too_long_for_a_run_fixing_its_window_leaves_the_old_rows_to_the_next(
    make_tenant, monkeypatch
):
    """A run fixing its window holds its row (apps.training.dataset); the pass waits for it with the
    tenant's lock held, which scheduling and the reaper wait for: past RUNS_WAIT_S it leaves the old
    interactions to the next pass, says so, and still does the rest."""
    import threading

    from django.db import transaction

    import apps.privacy.retention as retention
    from tests.fixtures.locks import held_in_a_thread

    monkeypatch.setattr(retention, "RUNS_WAIT_S", 0.5)
    tenant = make_tenant("retention-wait")
    base = BaseModel.objects.create(name="ret-wait-base", path="/nonexistent", family="qwen")
    adapter = Adapter.objects.create(tenant=tenant, name="tab", base_model=base, is_default=True)
    old = _log(tenant, prefix="old", days_ago=40)
    at = timezone.now() - timedelta(days=40)
    Feedback.objects.create(
        tenant=tenant, pending_client_id="p-old", outcome="accepted", occurred_at=at, received_at=at, updated_at=at
    )
    run = TrainingRun.objects.create(tenant=tenant, adapter=adapter, status="exporting")
    tenant.retention_days = 30
    tenant.save()
    release = threading.Event()

    def export(holding) -> None:  # as dataset_export holds its run while it fixes the window
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM training_trainingrun WHERE id = %s FOR KEY SHARE", [run.pk])
            holding.set()
            release.wait(timeout=60)

    with held_in_a_thread(export):
        try:
            report = retention_prune(tenant)
        finally:
            release.set()
    assert "a training run held its window or version past 0.5 s" in report.deferred
    assert report.deleted["interactions"] == 0 and report.deleted["pending_feedback"] == 1
    assert Interaction.objects.filter(tenant=tenant).count() == len(old)
    event = AuditEvent.objects.get(tenant=tenant, action="retention.prune")
    assert event.data["deferred"] == report.deferred
    TrainingRun.objects.filter(pk=run.pk).update(status="failed")
    assert retention_prune(tenant).deleted["interactions"] == len(old)  # the next pass goes on
