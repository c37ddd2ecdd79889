"""A label changed after a version learned it (the user changed their mind, or the client sent a
corrected outcome) is learned again by the next run of the lineage; the same label sent again (a
retry, a replayed batch, an editor's outcome re-posted, dated by the server at each arrival) is not."""

from __future__ import annotations

from datetime import timedelta

import pytest

from apps.adapters.services import adapter_version_register
from apps.interactions.models import Feedback
from apps.interactions.services import feedback_ingest
from apps.training.models import TrainingRun, TrainingRunEvent
from apps.training.selectors import training_events_eligible


@pytest.mark.django_db
def test_a_label_changed_after_a_version_learned_it_is_eligible_again_and_a_replay_is_not(
    tenant, tiny_adapter, add_events, make_lora_adapter
):
    add_events(6)
    v1 = adapter_version_register(tenant, adapter=tiny_adapter, source_dir=make_lora_adapter(1), enqueue_load=False)
    run = TrainingRun.objects.create(tenant=tenant, adapter=tiny_adapter, status="candidate", output_version=v1)
    learned = list(Feedback.objects.filter(tenant=tenant).order_by("id"))
    TrainingRunEvent.objects.bulk_create(
        [TrainingRunEvent(run=run, feedback=f, held_out=False, reward=0.0, outcome=f.outcome) for f in learned]
    )
    assert not training_events_eligible(tiny_adapter, parent=v1).exists()

    # Any two of the batch (its labels are written in key order, not the batch's): one to change to
    # "rejected", so one that is not rejected now, and another to replay.
    changed = next(f for f in learned if f.outcome != "rejected")
    replayed = next(f for f in learned if f.pk != changed.pk)
    later = (changed.occurred_at + timedelta(minutes=5)).isoformat()
    feedback_ingest(
        tenant, items=[{"client_id": changed.interaction.client_id, "outcome": "rejected", "occurred_at": later}]
    )
    # The same label again, with no time of its own: the server dates it now, a later occurred_at.
    feedback_ingest(tenant, items=[{"client_id": replayed.interaction.client_id, "outcome": replayed.outcome}])
    assert Feedback.objects.get(pk=replayed.pk).occurred_at > replayed.occurred_at

    assert list(training_events_eligible(tiny_adapter, parent=v1).values_list("pk", flat=True)) == [changed.pk]
    assert Feedback.objects.get(pk=replayed.pk).events_received == 2  # the replay was counted, not learned again
    # Rows from before the label was kept count as learned, whatever the label now.
    TrainingRunEvent.objects.filter(run=run).update(outcome="")
    assert not training_events_eligible(tiny_adapter, parent=v1).exists()
