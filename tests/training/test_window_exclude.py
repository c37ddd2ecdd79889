"""A rejected run's events left out of training: later windows skip them (trained and held-out
alike), the rest stay eligible, only a rejected run's can be, once, audited, over the API and the
dashboard."""

from __future__ import annotations

import pytest

from apps.interactions.models import Feedback
from apps.tenants.models import AuditEvent
from apps.training.models import TrainingRun, TrainingRunEvent
from apps.training.selectors import training_events_eligible, training_events_new, training_window_events
from apps.training.services import training_window_exclude

pytestmark = pytest.mark.django_db


def rejected_run_over(adapter, interaction_ids, *, status="rejected"):
    """A run that took the events of ``interaction_ids`` (the last one held out) and ended ``status``."""
    run = TrainingRun.objects.create(tenant=adapter.tenant, adapter=adapter, status=status)
    feedback = list(Feedback.objects.filter(interaction_id__in=interaction_ids).order_by("id"))
    TrainingRunEvent.objects.bulk_create(
        TrainingRunEvent(run=run, feedback=f, held_out=index == len(feedback) - 1, reward=0.75)
        for index, f in enumerate(feedback)
    )
    return run


def by_arrival(interaction_ids) -> list[str]:
    """The interactions in the order their feedback arrived (a window's oldest first): within one
    batch that is the order of their keys, in which labels are written (never the batch's own)."""
    rows = Feedback.objects.filter(interaction_id__in=interaction_ids).order_by("id")
    return [str(i) for i in rows.values_list("interaction_id", flat=True)]


def eligible_interactions(adapter) -> set[str]:
    return {str(f.interaction_id) for f in training_events_eligible(adapter, parent=None)}


def test_a_rejected_runs_events_left_out_are_skipped_by_every_later_window(tiny_adapter, add_events):
    wrong = add_events(6)
    later = add_events(4)
    run = rejected_run_over(tiny_adapter, wrong)
    # Not used up by the rejection: the next window would take the same oldest events first.
    assert [str(f.interaction_id) for f in training_window_events(tiny_adapter, parent=None, limit=6)] == by_arrival(
        wrong
    )
    other = rejected_run_over(tiny_adapter, later[:1])  # another rejected run, not left out

    training_window_exclude(tiny_adapter.tenant, run=run, actor="user:1")

    assert eligible_interactions(tiny_adapter) == set(later)  # the held-out one too is gone
    assert [str(f.interaction_id) for f in training_window_events(tiny_adapter, parent=None, limit=3)] == by_arrival(
        later
    )[:3]
    assert {str(f.interaction_id) for f in training_events_new(tiny_adapter, parent=None)} == set(later) - {later[0]}
    assert other.events.count() == 1 and Feedback.objects.filter(interaction_id__in=wrong).count() == 6  # kept


def test_only_a_rejected_run_and_only_once(tiny_adapter, add_events):
    from apps.common.exceptions import Conflict

    ids = add_events(4)
    candidate = rejected_run_over(tiny_adapter, ids[:2], status="candidate")
    with pytest.raises(Conflict, match=f"run {candidate.pk} is candidate"):
        training_window_exclude(tiny_adapter.tenant, run=candidate, actor="user:1")
    run = rejected_run_over(tiny_adapter, ids[2:])
    first = training_window_exclude(tiny_adapter.tenant, run=run, actor="user:1").window_excluded_at
    again = training_window_exclude(tiny_adapter.tenant, run=run, actor="user:2")
    assert again.window_excluded_at == first and again.window_excluded_by == "user:1"
    (event,) = AuditEvent.objects.filter(tenant=tiny_adapter.tenant, action="training_run.exclude_window")
    assert event.actor == "user:1" and event.target_id == str(run.pk) and event.data == {"adapter": "tab", "events": 2}


def test_the_api_leaves_them_out_and_says_so(tiny_adapter, add_events, make_client):
    ids = add_events(3)
    run = rejected_run_over(tiny_adapter, ids)
    client = make_client(tiny_adapter.tenant, scopes=["admin"])
    response = client.post(f"/v1/training-runs/{run.pk}/exclude-window")
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["id"] == run.pk and body["window_excluded_at"] and body["window_excluded_by"].startswith("key:")
    assert client.get(f"/v1/training-runs/{run.pk}").json()["window_excluded_at"] == body["window_excluded_at"]
    assert eligible_interactions(tiny_adapter) == set()


def test_the_api_refuses_a_run_that_is_not_rejected_and_a_key_without_admin(tiny_adapter, add_events, make_client):
    ids = add_events(2)
    run = rejected_run_over(tiny_adapter, ids, status="candidate")
    response = make_client(tiny_adapter.tenant, scopes=["admin"]).post(f"/v1/training-runs/{run.pk}/exclude-window")
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "run_not_rejected" and "only a rejected run's events" in error["message"]
    rejected = rejected_run_over(tiny_adapter, ids)
    ingest_only = make_client(tiny_adapter.tenant, scopes=["ingest"])
    assert ingest_only.post(f"/v1/training-runs/{rejected.pk}/exclude-window").status_code == 403
    assert make_client(tiny_adapter.tenant).post("/v1/training-runs/nope/exclude-window").status_code == 404
    assert not TrainingRun.objects.filter(window_excluded_at__isnull=False).exists()


def test_the_training_status_counts_them_as_left_out_not_as_learned(tiny_adapter, add_events):
    from apps.training.outlook import training_outlook

    ids = add_events(6)
    training_window_exclude(tiny_adapter.tenant, run=rejected_run_over(tiny_adapter, ids[:4]), actor="user:1")
    outlook = training_outlook(tiny_adapter)
    assert (outlook.left_out, outlook.already_trained, outlook.new) == (4, 0, 2)
